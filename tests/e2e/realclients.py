"""Helpers for the real-clients tests: run a client script plainly (no flagos_torchfl, plain CPU)
and under ``python -m flagos_torchfl run``, and read the JSON lines it prints."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

import pytest

from tests.helpers import clean_env, run_tree

CLIENTS = Path(__file__).resolve().parent / "clients"
INSTALL_HINT = 'pip install -e ".[realclients]"'


def requires(*packages: str):
    """Skip unless every package is importable (checked without importing it)."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)} ({INSTALL_HINT})")


def skip_unless_installed(*packages: str) -> None:
    """Inside a test: skip it unless every package is importable."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"not installed: {', '.join(missing)} ({INSTALL_HINT})")


def client(name: str) -> str:
    return str(CLIENTS / name)


def _env(extra: Optional[Mapping[str, str]]) -> dict:
    env = clean_env(extra)
    # commands such as `accelerate` are found next to this interpreter first
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["HF_HUB_OFFLINE"] = "1"
    return env


def run_plain(args: Sequence[str], env: Optional[Mapping[str, str]] = None, timeout: float = 300,
              cwd=None, command: bool = False) -> subprocess.CompletedProcess:
    """``python ARGS`` (or the command ARGS) with no flagos_torchfl activation: the baseline."""
    argv = list(args) if command else [sys.executable, *args]
    return run_tree(argv, _env(env), timeout, cwd=cwd)


def run_launched(args: Sequence[str], env: Optional[Mapping[str, str]] = None, timeout: float = 300,
                 cwd=None) -> subprocess.CompletedProcess:
    """``python -m flagos_torchfl run ARGS``."""
    return run_tree([sys.executable, "-m", "flagos_torchfl", "run", *args], _env(env), timeout, cwd=cwd)


def records(proc: subprocess.CompletedProcess, tag: str) -> list:
    """The JSON lines tagged ``tag`` the client printed; fails with the client's output if the
    client failed or printed none."""
    found = [json.loads(line) for line in proc.stdout.splitlines()
             if line.startswith("{") and f'"tag": "{tag}"' in line]
    assert proc.returncode == 0 and found, (
        f"client exited {proc.returncode} with no {tag!r} record\n--- stdout\n{proc.stdout[-3000:]}"
        f"\n--- stderr\n{proc.stderr[-6000:]}")
    return found


def by_rank(found: list) -> dict:
    return {r["rank"]: r for r in found}
