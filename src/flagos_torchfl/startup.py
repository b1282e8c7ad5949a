"""Activation of the processes the launcher starts, and of all their Python children.

``python -m flagos_torchfl run`` prepares its environment with :func:`prepare_environment`;
every child process inherits it:

- ``FL_BACKEND`` (+ ``FL_BACKEND_FROM_LAUNCHER=1``) when ``--backend`` was given, so the
  launcher's choice wins over ``FL_BACKEND`` and code everywhere (see :mod:`.selection`);
  ``--profile NAME`` gives ``FL_BACKEND=sim`` the same way, with ``FL_SIM_PROFILE=NAME``;
- :data:`BOOTSTRAP_DIR` at the front of ``PYTHONPATH``: each new interpreter (``subprocess`` of
  ``python``, ``multiprocessing`` spawn/forkserver children, DataLoader workers, torchrun
  workers) runs its ``sitecustomize.py`` at start-up;
- ``FL_ACTIVATE=1``: tells that ``sitecustomize`` to call :func:`activate` right after the
  process has imported torch. Processes that never import torch pay nothing else.

Forked children inherit the parent's activated state as it is. A child started with ``-I``/``-E``
(which ignore ``PYTHONPATH``) or with an environment that drops these variables is not activated.
Importing this module activates nothing.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import sys
from typing import MutableMapping, Optional, Sequence, Union

from . import variables
from .inherit import BOOTSTRAP_DIR, hook_children
from .log import get_logger

log = get_logger("launcher")

REPORT_MODULE = "flagos_torchfl.routing.report"


def prepare_environment(
    environ: MutableMapping[str, str],
    backends: Optional[Sequence[str]] = None,
    log_level: Optional[str] = None,
    report: Union[bool, str] = False,
    profile: Optional[str] = None,
    devices: Optional[int] = None,
) -> MutableMapping[str, str]:
    """Set in ``environ`` (and return it) the variables that make the launched program and every
    Python child it starts activate: ``backends`` are canonical names and ``profile`` a sim
    profile, already validated; ``report``: True (text) or ``"json"``."""
    hook_children(environ)
    if backends:
        variables.assign(environ, "FL_BACKEND", ",".join(backends))
        variables.assign(environ, "FL_BACKEND_FROM_LAUNCHER", "1")
        environ.pop("FL_PARENT_ACTIVATION", None)  # a nested launcher's own choice wins
    if log_level:
        variables.assign(environ, "FL_LOG_LEVEL", log_level)
    if profile:
        variables.assign(environ, "FL_SIM_PROFILE", profile)
    if report:
        variables.assign(environ, "FL_RUN_REPORT", "json" if report == "json" else "1")
    if devices is not None:
        variables.assign(environ, "FL_DEVICES", str(devices))
    return environ


def activate():
    """Select and activate the backend the ``FL_*`` environment asks for (automatic when none
    is named) and, under ``--report``, arrange the routing report at exit. Returns the
    Selection; raises what :func:`flagos_torchfl.auto_select_backend` raises."""
    from .api import activate_for_launcher

    selection = activate_for_launcher()
    if variables.read("FL_RUN_REPORT"):
        atexit.register(print_report)
    log.debug("process %d activated: %s (%s)", os.getpid(), selection.backend, selection.reason)
    return selection


def failure_message(exc: BaseException) -> str:
    """The one line a process prints when it cannot activate."""
    backend = variables.raw("FL_BACKEND") or "auto"
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return f"flagos_torchfl: cannot activate backend {backend}: {detail}"


def print_report() -> None:
    """Print the routing report and verdict to stderr (as JSON under ``run --json``), if the
    installed routing layer provides one."""
    try:
        found = importlib.util.find_spec(REPORT_MODULE) is not None
    except ImportError:
        found = False
    if not found:
        return
    from .routing import report

    as_json = variables.read("FL_RUN_REPORT") == "json"
    print(report.render_json() if as_json else report.render(), file=sys.stderr)
