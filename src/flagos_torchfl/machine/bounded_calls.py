"""Bounded probing helpers: run a vendor query tool or a plugin call without ever hanging or
raising. Each returns a value or a plain-words problem."""
from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterable, Optional, Tuple


def probe_timeout() -> float:
    """Seconds allowed for each query tool and each plugin import (``FL_PROBE_TIMEOUT``, default
    10); raises ConfigError for a value that is not a positive number of seconds."""
    from ..variables import read

    return read("FL_PROBE_TIMEOUT")


#: the most output read from a query tool (a version line needs far less)
MAX_TOOL_OUTPUT = 1 << 20


def run_tool(argv: list[str], timeout: float) -> Tuple[Optional[str], Optional[str]]:
    """Run ``argv`` in a session of its own; (stdout, None) on success, else (None, problem in
    plain words). A tool still running after ``timeout``, or printing more than
    :data:`MAX_TOOL_OUTPUT`, is killed with every process it started (its whole process group),
    so nothing it forked outlives the probe."""
    tool = argv[0]
    path = shutil.which(tool)
    if path is None:
        return None, f"{tool} not found"
    try:
        proc = subprocess.Popen(
            [path, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, start_new_session=True,
        )
    except OSError as exc:
        return None, f"{tool} could not be run: {exc}"
    deadline = time.monotonic() + timeout
    readers = [_CappedReader(proc.stdout), _CappedReader(proc.stderr)]
    while time.monotonic() < deadline and not any(r.overflow for r in readers):
        if proc.poll() is not None and not any(r.is_alive() for r in readers):
            break
        time.sleep(0.01)
    if any(r.overflow for r in readers):
        _kill_group(proc, readers)
        return None, f"{tool} printed more than {MAX_TOOL_OUTPUT} bytes"
    if proc.poll() is None or any(r.is_alive() for r in readers):
        _kill_group(proc, readers)
        return None, f"{tool} did not answer within {timeout:g} s"
    _close(readers)
    stdout, stderr = (r.data.decode(errors="replace") for r in readers)
    if proc.returncode != 0:
        lines = (stderr or stdout).strip().splitlines()
        detail = f": {lines[-1][:200]}" if lines else ""
        return None, f"{tool} exited with code {proc.returncode}{detail}"
    return stdout, None


class _CappedReader(threading.Thread):
    """Reads a pipe to its end, keeping at most :data:`MAX_TOOL_OUTPUT` bytes; stops reading
    (and sets ``overflow``) beyond that."""

    def __init__(self, stream):
        super().__init__(name="flagos-probe-pipe", daemon=True)
        self.stream, self.data, self.overflow = stream, b"", False
        self.start()

    def run(self):
        try:
            data = self.stream.read(MAX_TOOL_OUTPUT + 1)
        except (OSError, ValueError):
            data = b""
        self.overflow = len(data) > MAX_TOOL_OUTPUT
        self.data = data[:MAX_TOOL_OUTPUT]


def _kill_group(proc: subprocess.Popen, readers) -> None:
    """Kill the tool's process group, reap the tool, and close the pipes once their readers
    have seen the end (a process that left the group may keep them open: then they are left)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for reader in readers:
        reader.join(0.5)
    _close(readers)


def _close(readers) -> None:
    for reader in readers:
        if not reader.is_alive():
            reader.stream.close()


def query_drivers(backends: Iterable[Any], timeout: float) -> Dict[str, Tuple[Optional[str], Optional[str]]]:
    """``Backend.query_driver`` of every backend, all at once in threads: name -> (driver
    version, problem). Bounded by one ``timeout`` in all, whatever the number of hung tools."""
    backends = list(backends)
    if not backends:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(backends),
                                               thread_name_prefix="flagos-probe-tool") as pool:
        futures = {b.name: pool.submit(b.query_driver, timeout) for b in backends}
        return {name: future.result() for name, future in futures.items()}


def search_version(pattern: str, text: str) -> Optional[str]:
    """The first group of ``pattern`` in ``text`` if it looks like a version number."""
    m = re.search(pattern, text)
    if m and re.search(r"\d", m.group(1)):
        return m.group(1)
    return None


def call_with_timeout(fn: Callable[[], Any], timeout: float, what: str) -> Tuple[Any, Optional[str]]:
    """Run ``fn`` in a daemon thread; (result, None), or (None, problem) if it raised or hung.

    A call that hangs is abandoned (its thread stays parked) — the caller goes on.
    """
    box: dict = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:  # a probe never propagates anything
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"flagos-probe:{what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return None, f"{what} did not finish within {timeout:g} s"
    if "error" in box:
        exc = box["error"]
        return None, f"{what} failed: {type(exc).__name__}: {exc}".rstrip(": ")
    return box.get("value"), None
