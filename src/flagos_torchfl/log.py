"""The package logger: ``logging.getLogger("flagos_torchfl")``, level from ``FL_LOG_LEVEL``."""
from __future__ import annotations

import logging
import os
import sys

from .errors import ConfigError, suggestion

LOGGER_NAME = "flagos_torchfl"
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
#: the variable naming the level (declared with the others in :mod:`.variables`, which parses it
#: with :func:`parse_level`; read here, where the logger is made)
LEVEL_VARIABLE = "FL_LOG_LEVEL"


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the record (test capture included)."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def parse_level(text: str, what: str = LEVEL_VARIABLE) -> str:
    """A level name (any case) or number, as an upper-case string; ConfigError otherwise."""
    level = str(text).strip().upper()
    if level in LEVELS or (level.isascii() and level.isdigit()):
        return level
    raise ConfigError(f"invalid {what} {text!r}.{suggestion(level, LEVELS)} "
                      f"Valid levels: {', '.join(LEVELS)} or a number")


def level_from_env(environ=os.environ) -> int:
    """The level named by ``FL_LOG_LEVEL`` (a name or a number); WARNING when unset, and when
    invalid (after saying so once on stderr: the logger must exist before anything can raise)."""
    text = environ.get(LEVEL_VARIABLE, "").strip()
    try:
        level = parse_level(text) if text else None
    except ConfigError as exc:
        print(f"[flagos_torchfl] WARNING {exc}; using WARNING", file=sys.stderr)
        return logging.WARNING
    if level is None:
        return logging.WARNING
    return int(level) if level.isdigit() else getattr(logging, level)


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
