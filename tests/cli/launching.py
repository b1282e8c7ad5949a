"""Helpers for the launcher tests: write a program, run it under ``python -m flagos_torchfl run``."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Mapping, Optional

from tests.helpers import clean_env

#: prints, as one JSON line tagged ``tag``, what the process sees of its activation
REPORT_FUNCTION = r'''
def fl_state(tag, **extra):
    import json, os, sys
    ft = sys.modules.get("flagos_torchfl")
    sel = ft.current_backend() if ft else None
    line = json.dumps({"tag": tag, "pid": os.getpid(), "backend": sel and sel.backend,
                       "source": sel and sel.source, **extra})
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())  # one write: lines of concurrent processes never mix
'''


def write(folder: Path, name: str, source: str) -> Path:
    """Write ``source`` (dedented) to ``folder/name`` and return the path."""
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def launch(*args: str, cwd: Path, env: Optional[Mapping[str, str]] = None, timeout: float = 120):
    """Run ``python -m flagos_torchfl run ARGS`` in ``cwd`` with a clean FL_* environment."""
    return subprocess.run(
        [sys.executable, "-m", "flagos_torchfl", "run", *args], cwd=cwd, env=clean_env(env),
        capture_output=True, text=True, timeout=timeout,
    )


def states(stdout: str) -> list:
    """The JSON lines a program printed with ``fl_state``."""
    return [json.loads(line) for line in stdout.splitlines() if line.startswith('{"tag"')]


def state(stdout: str, tag: str) -> dict:
    """The one ``fl_state`` line tagged ``tag``."""
    found = [s for s in states(stdout) if s["tag"] == tag]
    assert len(found) == 1, f"expected one {tag!r} line in:\n{stdout}"
    return found[0]
