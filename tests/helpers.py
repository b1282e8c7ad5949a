"""Helpers shared by the tests: run python in a child interpreter with a chosen environment."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional

ROOT = Path(__file__).resolve().parent.parent
CLEAN_PREFIXES = ("FL_", "CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "ASCEND_RT_VISIBLE_DEVICES")


def clean_env(extra: Optional[Mapping[str, str]] = None) -> dict:
    """The current environment without any FL_* or device-mask variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_PREFIXES)}
    env.update(extra or {})
    return env


def run_python(args, env: Optional[Mapping[str, str]] = None, timeout: float = 120, cwd=None):
    """Run ``python ARGS`` and return the CompletedProcess (text mode)."""
    return subprocess.run(
        [sys.executable, *args], env=clean_env(env), capture_output=True, text=True,
        timeout=timeout, cwd=cwd or ROOT,
    )


def prepend_path(env: dict, variable: str, folder) -> dict:
    """``env`` with ``folder`` put at the front of the path list in ``variable``."""
    current = env.get(variable) or os.environ.get(variable, "")
    env[variable] = str(folder) + (os.pathsep + current if current else "")
    return env


def install_fixture(name: str, tmp_path_factory) -> Path:
    """The fixture distribution ``tests/fixtures/<name>``, pip-installed into a target folder
    (put it on ``PYTHONPATH`` to make its entry points visible)."""
    import shutil
    import subprocess

    import pytest

    target = tmp_path_factory.mktemp("site")
    source = tmp_path_factory.mktemp("src") / name
    shutil.copytree(ROOT / "tests" / "fixtures" / name, source)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"pip could not build tests/fixtures/{name} (setuptools<70.1 needs `wheel`):\n"
                    + proc.stderr[-2000:])
    return target


def chip(name: str, device_type: str, low_precision_dtype: str = "bfloat16", collective: str = "gloo",
         **capabilities):
    """A Backend instance declaring a chip that exists only in a test (never registered)."""
    from flagos_torchfl.backends import Backend

    attributes = dict(name=name, device_type=device_type, dispatch_key="PrivateUse1",
                      low_precision_dtype=low_precision_dtype, collective=collective, **capabilities)
    return type(f"{name.title()}Backend", (Backend,), attributes)()
