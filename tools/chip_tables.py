"""Turn a vendor's published operator table into ``src/flagos_torchfl/data/chips/<chip>.json``.

The committed tables were written by (the two yaml files taken with ``git show COMMIT:PATH``):

    pip download --no-deps torch-npu==2.14.0 -d /tmp/npu
    python tools/chip_tables.py ascend /tmp/npu/torch_npu-2.14.0-cp311-cp311-manylinux_2_28_x86_64.whl \
        --version 2.14.0
    python tools/chip_tables.py cambricon mlu_functions.yaml --repository Cambricon/torch_mlu \
        --ref r2.4_develop --commit 9e95f972d3bfda0a855f9500aec852664ceecb6a \
        --path codegen/mlu_functions.yaml --date 2025-02-18
    python tools/chip_tables.py mthreads musa_functions.yaml --repository MooreThreads/torch_musa \
        --ref main --commit 8b583b3f2fd0d9d3d9e74b9ec588a25d8bed1a30 \
        --path torch_musa/csrc/aten/ops/musa_functions.yaml --date 2026-01-19

Sources (only operator names are taken from them):

- ``ascend``: the torch_npu wheel. Its ``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml``
  has the sections ``supported``, ``autograd``, ``symint`` (ATen kernels for NPU tensors),
  ``quant`` (kernels for quantized NPU tensors), ``nestedtensor`` (nested tensors), and ``custom``
  / ``custom_autograd`` (torch_npu's own operators, namespace ``npu``). A name from another section
  that a custom section declares is a torch_npu operator, not an ATen one. An entry's ``sparse:``
  adds a kernel for sparse tensors; a mapping with ``sparse:`` but none of ``impl_ns``, ``op_api``,
  ``device_check`` has only that one (torch_npu's codegen leaves it out of the dense registrations).
- ``cambricon``: ``codegen/mlu_functions.yaml`` of Cambricon/torch_mlu. Sections ``aten``
  (ATen; ``dispatch:`` names the keys, default PrivateUse1), ``vision`` (``torchvision::``),
  ``audio`` (``torchaudio::``) and ``custom`` (``torch_mlu::``).
- ``mthreads``: ``torch_musa/csrc/aten/ops/musa_functions.yaml`` of MooreThreads/torch_musa, one
  list of ATen entries; ``dispatch:`` maps keys (possibly ``"A, B"``) to kernels, default PrivateUse1.

Entries may be a plain name (``add.Tensor``), a mapping with ``func:`` holding a name or a full
schema (``add.Tensor(Tensor self, ...) -> Tensor``), with or without an ``aten::`` prefix; a
``.default`` overload is the bare name. Anything else stops the tool with an error naming the entry.

Output (UTF-8 JSON, two-space indent, keys in the order below, lists sorted, trailing newline, so
the same source and the same torch give byte-identical files):

- ``schema``: 1.
- ``chip``, ``device_type``: the chip's name in this package and its PyTorch device type.
- ``source``: ``kind`` ``"wheel"`` (``package``, ``version``, ``file`` = the wheel's file name,
  ``file_sha256``, ``path`` inside the wheel, ``sha256`` of the table, ``date`` = the wheel's build
  date, from the archive timestamp of the table unless ``--date`` is given) or ``"repository"``
  (``repository``, ``ref``, ``commit``, ``path``, ``sha256`` of the table, ``date`` = commit date).
- ``torch_checked``: the torch release whose dispatcher split the names (``torch.__version__``
  without a local suffix).
- ``ops``: ATen overloads, in dispatcher spelling (``aten::add.Tensor``, default overload
  ``aten::relu``), that the source lists and that torch_checked knows.
- ``unknown_to_torch``: ATen names the source lists that torch_checked does not know (older or
  newer overloads, vendor additions in the ``aten`` namespace); kept, not dropped.
- ``only_for``: ``{op: [kinds]}`` for names (from ``ops`` or ``unknown_to_torch``) the source
  implements only for other tensor kinds than dense device tensors: ``quantized``, ``sparse``,
  ``sparse_csr``, ``nested``.
- ``vendor_ops``: the vendor's own operators, namespace-qualified (``npu::npu_format_cast``).
- ``counts``: ``entries`` (entries read), ``duplicates`` (entries naming an operator already
  read), and the length of each list / mapping above.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "src" / "flagos_torchfl" / "data" / "chips"

DEVICE_TYPES = {"ascend": "npu", "cambricon": "mlu", "mthreads": "musa"}
ASCEND_TABLE = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"

# Tensor kind of each PrivateUse1-family dispatch key; "dense" is the ordinary device tensor.
KEY_KINDS = {
    "PrivateUse1": "dense",
    "AutogradPrivateUse1": "dense",
    "QuantizedPrivateUse1": "quantized",
    "SparsePrivateUse1": "sparse",
    "SparseCsrPrivateUse1": "sparse_csr",
    "NestedTensorPrivateUse1": "nested",
}
ASCEND_SECTIONS = {"supported": "dense", "autograd": "dense", "symint": "dense",
                   "quant": "quantized", "nestedtensor": "nested"}
ASCEND_CUSTOM = ("custom", "custom_autograd")
ASCEND_METADATA = ("backend", "cpp_namespace")
ASCEND_DENSE_MARKS = {"impl_ns", "op_api", "device_check"}
CAMBRICON_NAMESPACES = {"aten": "aten", "vision": "torchvision", "audio": "torchaudio",
                        "custom": "torch_mlu"}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass
class Parsed:
    """What a source lists: ATen names with the tensor kinds they serve, and vendor operators."""
    entries: int = 0
    duplicates: int = 0
    aten: dict = field(default_factory=dict)  # "aten::name[.overload]" -> set of kinds
    vendor: set = field(default_factory=set)  # "ns::name[.overload]"

    def add_aten(self, name: str, kinds: Iterable[str]) -> None:
        self.entries += 1
        if name in self.aten:
            self.duplicates += 1
        self.aten.setdefault(name, set()).update(kinds)

    def add_vendor(self, name: str) -> None:
        self.entries += 1
        if name in self.vendor:
            self.duplicates += 1
        self.vendor.add(name)


def split_name(entry, where: str) -> tuple:
    """``(namespace or None, "name" or "name.overload")`` of one yaml entry: a string or a
    mapping with a ``func`` string, either a bare name or a full schema. ``.default`` becomes
    the bare name. Raises ValueError naming the entry for any other form."""
    func = entry.get("func") if isinstance(entry, dict) else entry
    if not isinstance(func, str) or not func.strip():
        raise ValueError(f"{where}: expected an operator name or a mapping with a 'func' string, got {entry!r}")
    name = func.split("(", 1)[0].strip()
    namespace = None
    if "::" in name:
        namespace, name = name.split("::", 1)
    base, _, overload = name.partition(".")
    if not (_IDENT.fullmatch(base) and (not overload or _IDENT.fullmatch(overload))
            and (namespace is None or _IDENT.fullmatch(namespace))):
        raise ValueError(f"{where}: {func!r} is not an operator name or schema")
    return namespace, base if overload in ("", "default") else f"{base}.{overload}"


def qualified(entry, where: str, namespace: str) -> str:
    """Dispatcher spelling ``namespace::name[.overload]`` of an entry expected in ``namespace``."""
    found, name = split_name(entry, where)
    if found not in (None, namespace):
        raise ValueError(f"{where}: {name!r} is in namespace {found!r}, expected {namespace!r}")
    return f"{namespace}::{name}"


def _section(values, where: str) -> list:
    if values is None:
        return []
    if not isinstance(values, list):
        raise ValueError(f"{where}: expected a list of entries, got {type(values).__name__}")
    return values


def _load(text: str, where: str, expected: type):
    data = yaml.safe_load(text)
    if not isinstance(data, expected):
        raise ValueError(f"{where}: expected a yaml {expected.__name__} at the top, got {type(data).__name__}")
    return data


def parse_ascend(text: str) -> Parsed:
    """Names listed by torch_npu's ``npu_native_functions_by_codegen.yaml``."""
    data = _load(text, "ascend table", dict)
    unknown = sorted(set(data) - set(ASCEND_SECTIONS) - set(ASCEND_CUSTOM) - set(ASCEND_METADATA))
    if unknown:
        valid = sorted([*ASCEND_SECTIONS, *ASCEND_CUSTOM, *ASCEND_METADATA])
        raise ValueError(f"ascend table: unknown sections {unknown}; known sections: {', '.join(valid)}")
    parsed = Parsed()
    custom = set()
    for section in ASCEND_CUSTOM:
        for entry in _section(data.get(section), section):
            name = qualified(entry, section, "npu")
            custom.add(name.split("::", 1)[1])
            parsed.add_vendor(name)
    for section, kind in ASCEND_SECTIONS.items():
        for entry in _section(data.get(section), section):
            _, name = split_name(entry, section)
            if name in custom:
                parsed.add_vendor(f"npu::{name}")
            else:
                parsed.add_aten(qualified(entry, section, "aten"), _ascend_kinds(entry, kind))
    return parsed


def _ascend_kinds(entry, kind: str) -> set:
    if not (isinstance(entry, dict) and "sparse" in entry):
        return {kind}
    return {kind, "sparse"} if ASCEND_DENSE_MARKS & set(entry) else {"sparse"}


def dispatch_kinds(dispatch, where: str) -> set:
    """Tensor kinds of an entry's ``dispatch`` (absent: PrivateUse1). Accepts a mapping from
    keys to kernels or a string of keys; keys may be joined by commas."""
    if dispatch is None:
        return {"dense"}
    if isinstance(dispatch, dict):
        keys = [k for joined in dispatch for k in str(joined).split(",")]
    elif isinstance(dispatch, str):
        keys = dispatch.split(",")
    else:
        raise ValueError(f"{where}: 'dispatch' must be a mapping or a string, got {dispatch!r}")
    kinds = set()
    for key in (k.strip() for k in keys):
        if key not in KEY_KINDS:
            raise ValueError(f"{where}: unknown dispatch key {key!r}; known keys: {', '.join(sorted(KEY_KINDS))}")
        kinds.add(KEY_KINDS[key])
    return kinds


def parse_cambricon(text: str) -> Parsed:
    """Names listed by torch_mlu's ``codegen/mlu_functions.yaml``."""
    data = _load(text, "cambricon table", dict)
    unknown = sorted(set(data) - set(CAMBRICON_NAMESPACES))
    if unknown:
        raise ValueError(f"cambricon table: unknown sections {unknown}; known sections: "
                         f"{', '.join(sorted(CAMBRICON_NAMESPACES))}")
    parsed = Parsed()
    for section, namespace in CAMBRICON_NAMESPACES.items():
        for entry in _section(data.get(section), section):
            name = qualified(entry, section, namespace)
            if namespace == "aten":
                where = f"{section}: {name}"
                parsed.add_aten(name, dispatch_kinds(entry.get("dispatch") if isinstance(entry, dict) else None, where))
            else:
                parsed.add_vendor(name)
    return parsed


def parse_mthreads(text: str) -> Parsed:
    """Names listed by torch_musa's ``musa_functions.yaml``."""
    parsed = Parsed()
    for entry in _section(_load(text, "mthreads table", list), "mthreads table"):
        name = qualified(entry, "mthreads table", "aten")
        dispatch = entry.get("dispatch") if isinstance(entry, dict) else None
        parsed.add_aten(name, dispatch_kinds(dispatch, f"mthreads table: {name}"))
    return parsed


PARSERS = {"ascend": parse_ascend, "cambricon": parse_cambricon, "mthreads": parse_mthreads}


def torch_names() -> tuple:
    """(torch release without local suffix, every operator name its dispatcher knows)."""
    import torch

    return torch.__version__.split("+", 1)[0], frozenset(torch._C._dispatch_get_all_op_names())


def build_table(chip: str, source: dict, parsed: Parsed, torch_version: str, known: frozenset) -> dict:
    """The data file's content (see the module docstring) for ``parsed`` split by ``known``."""
    ops = sorted(n for n in parsed.aten if n in known)
    unknown = sorted(n for n in parsed.aten if n not in known)
    only_for = {n: sorted(parsed.aten[n]) for n in sorted(parsed.aten) if "dense" not in parsed.aten[n]}
    vendor = sorted(parsed.vendor)
    return {
        "schema": 1,
        "chip": chip,
        "device_type": DEVICE_TYPES[chip],
        "source": source,
        "torch_checked": torch_version,
        "ops": ops,
        "unknown_to_torch": unknown,
        "only_for": only_for,
        "vendor_ops": vendor,
        "counts": {
            "entries": parsed.entries,
            "duplicates": parsed.duplicates,
            "ops": len(ops),
            "unknown_to_torch": len(unknown),
            "only_for": len(only_for),
            "vendor_ops": len(vendor),
        },
    }


def render(table: dict) -> str:
    """Deterministic JSON text of a table."""
    return json.dumps(table, indent=2, ensure_ascii=False) + "\n"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_wheel(wheel: Path, path: str, package: str, version: str, date: Optional[str]) -> tuple:
    """(table text, provenance) from a wheel. Checks that the wheel's metadata names
    ``package`` ``version``; the date defaults to the archive timestamp of the table."""
    raw = wheel.read_bytes()
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        if path not in names:
            near = [n for n in names if n.endswith(".yaml")]
            raise ValueError(f"{wheel.name} has no {path!r}; its yaml files: {', '.join(near) or 'none'}")
        info = archive.getinfo(path)
        table = archive.read(info)
        metadata = [n for n in names if n.endswith(".dist-info/METADATA")]
        if len(metadata) != 1:
            raise ValueError(f"{wheel.name}: expected one .dist-info/METADATA, found {metadata}")
        fields = dict(line.split(": ", 1) for line in archive.read(metadata[0]).decode("utf-8").splitlines()
                      if ": " in line and not line.startswith(" "))
    found = (fields.get("Name", ""), fields.get("Version", ""))
    if (_canonical(found[0]), found[1]) != (_canonical(package), version):
        raise ValueError(f"{wheel.name} is {found[0]} {found[1]}, not {package} {version}")
    source = {
        "kind": "wheel",
        "package": package,
        "version": version,
        "file": wheel.name,
        "file_sha256": _sha256(raw),
        "path": path,
        "sha256": _sha256(table),
        "date": _check_date(date) if date else "%04d-%02d-%02d" % info.date_time[:3],
    }
    return table.decode("utf-8"), source


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _check_date(date: str) -> str:
    if not _DATE.fullmatch(date or ""):
        raise ValueError(f"date {date!r} must be YYYY-MM-DD (the source's own date, not today's)")
    return date


def read_repository_file(file: Path, repository: str, ref: str, commit: str, path: str, date: str) -> tuple:
    """(table text, provenance) from a file taken out of a repository at ``commit``."""
    if not _COMMIT.fullmatch(commit):
        raise ValueError(f"commit {commit!r} must be a full 40-digit lowercase hex commit id")
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repository):
        raise ValueError(f"repository {repository!r} must be owner/name")
    raw = file.read_bytes()
    source = {
        "kind": "repository",
        "repository": repository,
        "ref": ref,
        "commit": commit,
        "path": path,
        "sha256": _sha256(raw),
        "date": _check_date(date),
    }
    return raw.decode("utf-8"), source


def generate(chip: str, text: str, source: dict, torch_info: Optional[tuple] = None) -> str:
    """Rendered data file of ``chip`` from a table's text and its provenance."""
    version, known = torch_info or torch_names()
    return render(build_table(chip, source, PARSERS[chip](text), version, known))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="chip", required=True)
    wheel = sub.add_parser("ascend", help="from a torch_npu wheel")
    wheel.add_argument("source", type=Path, help="the wheel file")
    wheel.add_argument("--package", default="torch-npu")
    wheel.add_argument("--version", required=True)
    wheel.add_argument("--path", default=ASCEND_TABLE, help="the table inside the wheel")
    wheel.add_argument("--date", help="YYYY-MM-DD; default: the archive timestamp of the table")
    for chip in ("cambricon", "mthreads"):
        repo = sub.add_parser(chip, help="from the yaml file of the vendor's repository")
        repo.add_argument("source", type=Path, help="the yaml file, as found at --commit")
        repo.add_argument("--repository", required=True, help="owner/name")
        repo.add_argument("--ref", required=True, help="the branch or tag the commit was taken from")
        repo.add_argument("--commit", required=True)
        repo.add_argument("--path", required=True, help="the file's path in the repository")
        repo.add_argument("--date", required=True, help="the commit date, YYYY-MM-DD")
    for command in sub.choices.values():
        command.add_argument("--out", type=Path, help="output file (default: the package's data/chips/<chip>.json)")
    args = parser.parse_args(argv)
    try:
        if args.chip == "ascend":
            text, source = read_wheel(args.source, args.path, args.package, args.version, args.date)
        else:
            text, source = read_repository_file(args.source, args.repository, args.ref, args.commit,
                                                args.path, args.date)
        content = generate(args.chip, text, source)
    except (OSError, ValueError, zipfile.BadZipFile, yaml.YAMLError) as exc:
        print(f"chip_tables: {exc}", file=sys.stderr)
        return 2
    out = args.out or DATA_DIR / f"{args.chip}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(content, encoding="utf-8")
    counts = json.loads(content)["counts"]
    print(f"{out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
