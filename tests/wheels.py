"""Real vendor plugin wheels for the tests, fetched from the package index with pip at test time
(never committed) and installed with ``--no-deps --target`` into a side folder: put that folder on
``PYTHONPATH`` to make the plugin, and its ``torch.backends`` entry point, visible to a child
interpreter. The main environment is never touched (the plugin would break its ``import torch``).

Downloads and installs are cached in ``$TORCHFL_TEST_WHEELS`` (default
``~/.cache/flagos_torchfl-tests``), so a second run needs no network.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("TORCHFL_TEST_WHEELS") or Path.home() / ".cache" / "flagos_torchfl-tests")


def wheel(package: str, version: str) -> Path:
    """The wheel of ``package==version`` for this Python, downloaded once with
    ``pip download --no-deps``; the test fails (it is not skipped) when pip cannot get it."""
    stem = package.replace("-", "_")
    CACHE.mkdir(parents=True, exist_ok=True)
    found = sorted(CACHE.glob(f"{stem}-{version}-*.whl"))
    if not found:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                               f"{package}=={version}", "-d", str(CACHE)],
                              capture_output=True, text=True, timeout=900)
        found = sorted(CACHE.glob(f"{stem}-{version}-*.whl"))
        if proc.returncode != 0 or not found:
            pytest.fail(f"pip could not download {package}=={version} (the tests need the real wheel):\n"
                        + proc.stderr[-2000:])
    return found[-1]


def site(package: str, version: str) -> Path:
    """A folder holding ``package==version`` installed with ``pip install --no-deps --target``."""
    target = CACHE / f"site-{package}-{version}"
    if any(target.glob("*.dist-info")):
        return target
    staging = CACHE / f".staging-{package}-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
                           "--target", str(staging), str(wheel(package, version))],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        pytest.fail(f"pip could not install {package}=={version} into {staging}:\n" + proc.stderr[-2000:])
    try:
        staging.rename(target)
    except OSError:  # another run installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return target


def read_member(path: Path, member: str) -> str:
    """The text of ``member`` inside the wheel at ``path``."""
    with zipfile.ZipFile(path) as archive:
        return archive.read(member).decode("utf-8")
