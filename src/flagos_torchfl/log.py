"""The package logger: ``logging.getLogger("flagos_torchfl")``, level from ``FL_LOG_LEVEL``."""
from __future__ import annotations

import logging
import os
import sys

LOGGER_NAME = "flagos_torchfl"
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (test capture included)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def level_from_env(environ=os.environ) -> int:
    """The level named by ``FL_LOG_LEVEL`` (a name or a number); WARNING when unset or invalid."""
    raw = environ.get("FL_LOG_LEVEL", "").strip().upper()
    if not raw:
        return logging.WARNING
    if raw.isdigit():
        return int(raw)
    return getattr(logging, raw) if raw in _LEVELS else logging.WARNING


def get_logger(name: str | None = None) -> logging.Logger:
    """The package logger, or its child ``flagos_torchfl.<name>``; configured on first use."""
    root = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h, _StderrHandler) for h in root.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[flagos_torchfl] %(levelname)s %(message)s"))
        root.addHandler(handler)
        root.setLevel(level_from_env())
        root.propagate = False
    return root.getChild(name) if name else root
