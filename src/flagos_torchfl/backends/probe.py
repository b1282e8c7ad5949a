"""Bounded probing helpers: run a vendor query tool or a plugin call without ever hanging or
raising. Each returns a value or a plain-words problem."""
from __future__ import annotations

import re
import shutil
import subprocess
import threading
from typing import Any, Callable, Optional, Tuple


def probe_timeout() -> float:
    """Seconds allowed for each query tool and each plugin import (``FL_PROBE_TIMEOUT``, default
    10); raises ConfigError for a value that is not a positive number of seconds."""
    from ..variables import read

    return read("FL_PROBE_TIMEOUT")


def run_tool(argv: list[str], timeout: float) -> Tuple[Optional[str], Optional[str]]:
    """Run ``argv``; (stdout, None) on success, else (None, problem in plain words)."""
    tool = argv[0]
    path = shutil.which(tool)
    if path is None:
        return None, f"{tool} not found"
    try:
        proc = subprocess.run(
            [path, *argv[1:]], capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL, errors="replace",
        )
    except subprocess.TimeoutExpired:
        return None, f"{tool} did not answer within {timeout:g} s"
    except OSError as exc:
        return None, f"{tool} could not be run: {exc}"
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        detail = f": {err[-1][:200]}" if err else ""
        return None, f"{tool} exited with code {proc.returncode}{detail}"
    return proc.stdout, None


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
