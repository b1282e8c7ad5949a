"""``env``: a copy-paste environment report for bug reports."""
from __future__ import annotations

import os
import platform
import re
import sys
from importlib import metadata
from typing import List, Mapping

from .. import variables
from ..version import __version__
from ..backends import registry
from ..errors import suggestion
from . import detect

#: device and launcher variables worth reporting beside each backend's visible-devices variable
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH", re.IGNORECASE)


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
    lines.append("- Environment: " + (", ".join(environment(os.environ)) or "none set"))
    lines.append("- NVIDIA's variables as each chip reads them (applied at its activation): "
                 + ("; ".join(cuda_environment(os.environ)) or "none with a counterpart set"))
    data = detect.collect()
    lines.append("- Backends:")
    for row in data["backends"]:
        drv = f", driver {row['driver']}" if row.get("driver") else ""
        lines.append(f"    - {row['name']}: {detect._status(row)}; devices {detect._devices(row)}{drv}")
    pick = data["auto_select"]
    lines.append(f"- auto_select_backend(): {pick['backend'] or 'fails'} ({pick['why']})")
    return "\n".join(lines)


def environment(environ: Mapping[str, str]) -> List[str]:
    """``NAME=value`` for each set variable the package declares and each device variable
    (values of names that suggest a secret masked); other ``FL_*`` names are listed as unknown,
    with the closest declared name and without their value."""
    devices = {*DEVICE_VARIABLES, *(b.visible_devices_env for b in registry().backends() if b.visible_devices_env)}
    shown = []
    for name in sorted(environ):
        value = "***" if _SECRET.search(name) else environ[name]
        if name in variables.VARIABLES or name in devices:
            shown.append(f"{name}={value}")
        elif name.startswith("FL_"):
            shown.append(f"{name} (not a flagos_torchfl variable.{suggestion(name, variables.VARIABLES)} "
                         "Value not shown)")
    return shown


def cuda_environment(environ: Mapping[str, str]) -> List[str]:
    """Per chip with a table (``Backend.cuda_environment``), what activating it would set:
    ``ascend: NCCL_SOCKET_IFNAME=lo -> HCCL_SOCKET_IFNAME=lo``; a value the chip's variable
    cannot take is shown as not translated."""
    from ..machine import environment as translation

    found = []
    for backend in registry().backends():
        rules = backend.cuda_environment()
        moves = [f"{name}={environ[name]} -> {rule.target}={value}" if value is not None
                 else f"{name}={environ[name]} not translated ({rule.target} takes no such value)"
                 for rule, name, value in translation.planned(rules, dict(environ))]
        if moves:
            found.append(f"{backend.name}: {', '.join(moves)}")
    return found


def run(args) -> int:
    print("Copy-and-paste the text below in your bug report.\n")
    print(report())
    return 0
