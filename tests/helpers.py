"""Helpers shared by the tests: run python in a child interpreter with a chosen environment."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLEAN_PREFIXES = ("FL_", "CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "ASCEND_RT_VISIBLE_DEVICES")


@pytest.fixture
def no_activation(monkeypatch):
    """The test starts and ends with nothing active, no assigned setting and no ``FL_*`` or
    device-mask variable from the caller's environment (a module takes it with
    ``pytestmark = pytest.mark.usefixtures("no_activation")`` and imports it from here)."""
    import flagos_torchfl as ft
    from flagos_torchfl import api

    for name in list(os.environ):
        if name.startswith(CLEAN_PREFIXES) or "VISIBLE_DEVICES" in name:
            monkeypatch.delenv(name)
    ft.deactivate()
    yield
    ft.deactivate()
    api._assigned.clear()


def clean_env(extra: Optional[Mapping[str, str]] = None) -> dict:
    """The current environment without any FL_* or device-mask variable, with this interpreter's
    scripts folder first on ``PATH`` (``torchrun`` is found as in an activated venv, also when
    the tests run as ``venv/bin/python -m pytest``), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(CLEAN_PREFIXES)}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, taken below the kernel's ephemeral
    range: a port the kernel hands out (a bind to port 0, any outgoing connection, such as
    another test's store client) can be taken again between this call and the child's bind,
    a port outside that range only by another explicit bind."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(100):
        port = random.randrange(10000, max(low, 10001))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port found below the ephemeral range")


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


MARK_VARIABLE = "TORCHFL_TEST_TREE"


def kill_tree(mark: str) -> int:
    """SIGKILL every process whose environment carries ``MARK_VARIABLE=mark`` (the whole tree a
    :func:`run_tree` call started, ranks that torchrun put in sessions of their own included);
    returns how many were killed."""
    import signal

    needle = f"{MARK_VARIABLE}={mark}".encode()
    killed = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
        except (OSError, ProcessLookupError):
            continue
    return killed


def run_tree(argv, env: Mapping[str, str], timeout: float, cwd=None,
             merge_stderr: bool = False) -> subprocess.CompletedProcess:
    """Run ``argv`` (a launcher, torchrun, accelerate...) with output in files, not pipes; past
    ``timeout`` every process of its tree is killed, and so is any process of the tree still
    alive when the command itself has ended (a rank stuck at exit). Never hangs."""
    import tempfile
    import uuid

    mark = uuid.uuid4().hex
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(list(argv), env={**env, MARK_VARIABLE: mark}, stdout=out,
                                stderr=out if merge_stderr else err, text=True, cwd=cwd or ROOT,
                                start_new_session=True)
        note = ""
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(mark)
            proc.wait()
            note = f"\n<killed after {timeout:g} s>"
        leftover = kill_tree(mark)
        if leftover:
            note += f"\n<{leftover} process(es) of the run were still alive at its end and were killed>"
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if merge_stderr:
        stdout += note
    else:
        stderr += note
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)
