"""Building the sim's C++ runtime at first use, with faults injected into the compiler: none
on PATH, one that fails, one that hangs; concurrent first uses build once; and a program whose
machine cannot build it runs the sim on its Python guard, saying why (or stops, when the native
runtime was required)."""
from __future__ import annotations

import concurrent.futures
import os
import stat
from pathlib import Path

import pytest

from flagos_torchfl.sim.runtime import cpp as native
from tests.helpers import run_python

pytestmark = pytest.mark.needs_sim


def _compiler(folder: Path, body: str) -> Path:
    """An executable shell script standing in for the C++ compiler."""
    path = folder / "fake-c++"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_no_compiler_on_path(tmp_path, monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(native.CppUnavailable, match="no C.. compiler found .set CXX"):
        native.load(cache_dir=tmp_path / "cache")
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(native.CppUnavailable, match="CXX='no-such-compiler' names no program"):
        native.load(cache_dir=tmp_path / "cache")


def test_a_failing_compiler_is_named_with_its_last_words(tmp_path, monkeypatch):
    fake = _compiler(tmp_path, 'echo "fatal error: c10/core/Device.h: No such file" >&2; exit 4')
    monkeypatch.setenv("CXX", str(fake))
    with pytest.raises(native.CppUnavailable) as failed:
        native.load(cache_dir=tmp_path / "cache")
    assert f"{fake} failed (status 4)" in str(failed.value) and "No such file" in str(failed.value)
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.suffix in (".so", ".tmp")]


def test_a_hanging_compiler_is_abandoned(tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(_compiler(tmp_path, "sleep 60")))
    with pytest.raises(native.CppUnavailable, match="took over 1 s"):
        native.load(cache_dir=tmp_path / "cache", timeout=1)


@pytest.mark.full
def test_processes_starting_at_once_build_it_once(tmp_path, monkeypatch):
    """Every first use waits on the build folder's lock; the first builds, the others load it."""
    log = tmp_path / "invocations"
    real = native.find_compiler()
    monkeypatch.setenv("CXX", str(_compiler(tmp_path, f'echo x >> "{log}"\nexec "{real}" "$@"')))
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        loaded = list(pool.map(lambda _: native.load(cache_dir=tmp_path / "cache"), range(3)))
    assert log.read_text().count("x") == 1
    assert len({r.path for r in loaded}) == 1 and loaded[0].path.name == native.LIBRARY_NAME


PROGRAM = """
import torch, flagos_torchfl as ft, flagos_torchfl.sim as fsim
ft.init_backend("sim")
x = torch.ones(3, device="cuda", requires_grad=True)
(x * 2).sum().backward()
print("RUNTIME", fsim.runtime_kind(), x.grad.device, x.grad.sum().item())
"""


@pytest.mark.full
def test_a_machine_without_a_working_compiler_runs_the_python_guard(tmp_path):
    fake = _compiler(tmp_path, "echo 'cc1plus: out of memory' >&2; exit 1")
    env = {"FL_BACKEND": "sim", "CXX": str(fake), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    done = run_python(["-c", PROGRAM], env=env)
    assert done.returncode == 0, done.stderr
    assert "RUNTIME python sim:0 6.0" in done.stdout
    assert "running with its Python device guard" in done.stderr and "out of memory" in done.stderr
    required = run_python(["-c", PROGRAM], env={**env, "FL_SIM_RUNTIME": "cpp"})
    assert required.returncode != 0 and "RUNTIME" not in required.stdout
    assert "the sim's C++ runtime cannot be had" in required.stderr and "out of memory" in required.stderr
    assert "ConfigError" not in required.stderr


@pytest.mark.full
def test_an_unwritable_cache_builds_in_the_temporary_folder(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the cache folder would go")
    env = {"FL_BACKEND": "sim", "XDG_CACHE_HOME": str(blocked), "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    done = run_python(["-c", PROGRAM], env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "RUNTIME cpp sim:0 6.0" in done.stdout
    assert list((tmp_path / "tmp").glob(f"flagos_torchfl-sim-cpp-{os.getuid()}/*/{native.LIBRARY_NAME}"))
