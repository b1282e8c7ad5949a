"""``env``: a copy-paste environment report for bug reports."""
from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

from .. import __version__
from ..backends import registry
from . import detect

ENV_PREFIXES = ("FL_", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES",
                "MLU_VISIBLE_DEVICES", "MUSA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "WORLD_SIZE")


def add_parser(sub) -> None:
    p = sub.add_parser("env", help="print an environment report to paste into a bug report")
    p.set_defaults(func=run)


def distribution_version(name: str) -> str:
    for candidate in (name, name.replace("_", "-")):
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def report() -> str:
    import torch

    lines = [
        "- flagos_torchfl version: " + __version__,
        f"- Platform: {platform.platform()}",
        f"- Python version: {platform.python_version()} ({sys.executable})",
        f"- torch version: {torch.__version__} (CUDA {torch.version.cuda}, HIP {torch.version.hip})",
    ]
    plugins = sorted({b.plugin_module for b in registry().backends() if b.plugin_module})
    for module in plugins + ["flag_gems", "transformers"]:
        lines.append(f"- {module} version: {distribution_version(module)}")
    variables = sorted(k for k in os.environ if k.startswith(ENV_PREFIXES))
    lines.append("- Environment: " + (", ".join(f"{k}={os.environ[k]}" for k in variables) or "none set"))
    data = detect.collect()
    lines.append("- Backends:")
    for row in data["backends"]:
        drv = f", driver {row['driver']}" if row.get("driver") else ""
        lines.append(f"    - {row['name']}: {detect._status(row)}; devices {detect._devices(row)}{drv}")
    pick = data["auto_select"]
    lines.append(f"- auto_select_backend(): {pick['backend'] or 'fails'} ({pick['why']})")
    return "\n".join(lines)


def run(args) -> int:
    print("Copy-and-paste the text below in your bug report.\n")
    print(report())
    return 0
