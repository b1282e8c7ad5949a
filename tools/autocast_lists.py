"""Regenerate ``src/flagos_torchfl/data/autocast_cuda.json`` (CUDA's autocast operator lists)
from the ATen header the installed PyTorch wheel ships (``torch/include/ATen/autocast_mode.h``,
which is ``aten/src/ATen/autocast_mode.h`` of the commit ``torch.version.git_version`` names).

The header's ``AT_FORALL_*`` macros hold the lists CUDA registers at its autocast key;
``aten/src/ATen/autocast_mode.cpp`` (``TORCH_LIBRARY_IMPL(aten, Autocast, m)``) adds
``cudnn_convolution`` and ``cudnn_convolution_transpose`` to the lower-precision policy and bans
``binary_cross_entropy``. Those three are not in the header (``CPP_LOWER`` / ``CPP_BANNED`` below);
tests/precision/test_autocast_data.py compares the data with the installed dispatcher and names
every difference when a new PyTorch changes them.

    python tools/autocast_lists.py            # print the JSON
    python tools/autocast_lists.py --write    # replace the data file
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "src" / "flagos_torchfl" / "data" / "autocast_cuda.json"
HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"

MACROS = {
    "lower_precision_fp": "AT_FORALL_LOWER_PRECISION_FP",
    "fp32": "AT_FORALL_FP32",
    "fp32_set_opt_dtype": "AT_FORALL_FP32_SET_OPT_DTYPE",
    "promote": "AT_FORALL_PROMOTE",
}
CPP_LOWER = ["aten::cudnn_convolution", "aten::cudnn_convolution_transpose"]
CPP_BANNED = ["aten::binary_cross_entropy"]


def _macro_body(text: str, macro: str) -> str:
    match = re.search(rf"#define {macro}\(_\)(.*?)(?:\n\s*\n|\n#)", text, re.S)
    if not match:
        raise SystemExit(f"{macro} not found in {HEADER}")
    return match.group(1)


def _names(body: str) -> list[str]:
    out = []
    for op, overload in re.findall(r"_\(\s*(\w+)\s*(?:,\s*(\w+))?\s*\)", body):
        out.append(f"aten::{op}" + (f".{overload}" if overload else ""))
    return out


def _signature(overload) -> list[tuple[str, str]]:
    """(name, type) per argument, optional types as their inner type (``Scalar?`` as ``Scalar``)."""
    return [(a.name, re.sub(r"^Optional\[(.*)\]$", r"\1", str(a.type)))
            for a in overload._schema.arguments]


def _append_dtype(text: str) -> dict[str, str]:
    """``AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE``: registered overload -> the overload it calls
    with a dtype appended (found by schema: same name, same arguments plus ``dtype``)."""
    body = _macro_body(text, "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE")
    found = {}
    for name in re.findall(r'"([\w.]+)"', body):
        op, _, overload = name.partition(".")
        packet = getattr(torch.ops.aten, op)
        args = _signature(getattr(packet, overload))
        for candidate in packet.overloads():
            cargs = _signature(getattr(packet, candidate))
            if cargs[:-1] == args and cargs[-1][0] == "dtype":
                found[f"aten::{name}"] = f"aten::{op}.{candidate}"
        if f"aten::{name}" not in found:
            raise SystemExit(f"no dtype-taking overload of aten::{op} matches {name}")
    return found


def build() -> dict:
    text = HEADER.read_text()
    policies = {key: _names(_macro_body(text, macro)) for key, macro in MACROS.items()}
    policies["lower_precision_fp"] += CPP_LOWER
    policies["fp32_append_dtype"] = _append_dtype(text)
    policies["banned"] = CPP_BANNED
    return {
        "about": ("CUDA's autocast operator lists (the kernels PyTorch registers at the "
                  "AutocastCUDA dispatch key), by cast policy. Names are dispatcher names. "
                  "fp32_append_dtype maps the registered overload to the dtype-taking overload "
                  "it calls."),
        "provenance": {
            "torch_version": torch.__version__.split("+")[0],
            "commit": torch.version.git_version,
            "files": {
                "aten/src/ATen/autocast_mode.h": "AT_FORALL_LOWER_PRECISION_FP, AT_FORALL_FP32, "
                "AT_FORALL_FP32_SET_OPT_DTYPE, AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE, "
                "AT_FORALL_PROMOTE (read from the wheel's torch/include/ATen/autocast_mode.h)",
                "aten/src/ATen/autocast_mode.cpp": "TORCH_LIBRARY_IMPL(aten, Autocast, m): adds "
                "cudnn_convolution and cudnn_convolution_transpose (lower_precision_fp) and bans "
                "binary_cross_entropy",
            },
        },
        "policies": policies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {DATA}")
    text = json.dumps(build(), indent=1) + "\n"
    if parser.parse_args().write:
        DATA.write_text(text)
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
