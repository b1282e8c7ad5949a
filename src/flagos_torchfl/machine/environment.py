"""Environment variables written for NVIDIA reaching the chip's own: ``NCCL_SOCKET_IFNAME=lo``
becomes ``HCCL_SOCKET_IFNAME=lo`` on Ascend, ``CUDA_LAUNCH_BLOCKING=1`` ``MUSA_LAUNCH_BLOCKING=1``
on Moore Threads. The table is data (``data/cuda_environment.json``, each rule with where it was
read); ``Backend.cuda_environment()`` gives a chip's rules.

Rules:

- a variable the user set wins; one this package set (recorded in the internal variable
  ``FL_ENVIRONMENT_TRANSLATED``, which children inherit) is translated again from the process's
  own NVIDIA variable, so a child's own value wins over the one its parent translated;
- a value the chip's variable cannot take (``NCCL_BUFFSIZE=lots``) is left untranslated, with a
  warning;
- every translation returns an undo that restores the variables and the record exactly.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Dict, List, MutableMapping, Optional, Sequence, Tuple

from .. import variables
from ..data_files import read_json
from ..log import get_logger

log = get_logger("backends")
MARK = "FL_ENVIRONMENT_TRANSLATED"


def _zero_or_one(text: str) -> str:
    return "0" if int(text.strip()) == 0 else "1"


def _bytes_to_mib(text: str) -> str:
    count = int(text.strip())
    if count < 1:
        raise ValueError(text)
    return str(math.ceil(count / (1 << 20)))


_CONVERSIONS: Dict[str, Callable[[str], str]] = {"same": lambda text: text, "zero_or_one": _zero_or_one,
                                                  "bytes_to_mib": _bytes_to_mib}


@dataclass(frozen=True)
class Counterpart:
    """One rule: the chip's variable ``target`` takes the value of the first of ``sources`` that
    is set, converted by ``value`` (``same``, ``zero_or_one``, ``bytes_to_mib``); ``source``
    says where the fact was read."""
    sources: Tuple[str, ...]
    target: str
    value: str
    source: str

    def convert(self, text: str) -> Optional[str]:
        """The chip's value for NVIDIA's ``text``; None when it has none."""
        try:
            return _CONVERSIONS[self.value](text)
        except (ValueError, KeyError):
            return None


@lru_cache(maxsize=None)
def counterparts(chip: str) -> Tuple[Counterpart, ...]:
    """The rules of ``chip`` (a backend name; none for a chip without a table)."""
    data = read_json("cuda_environment.json")
    return tuple(Counterpart(tuple(r["from"]), r["to"], r["value"], r["source"])
                 for r in data["chips"].get(chip, ()))


def _marks(environ: MutableMapping[str, str]) -> Dict[str, str]:
    pairs = (item.partition("=") for item in environ.get(MARK, "").split(";") if "=" in item)
    return {name: value for name, _, value in pairs}


def planned(rules: Sequence[Counterpart], environ: MutableMapping[str, str] = os.environ
            ) -> List[Tuple[Counterpart, str, Optional[str]]]:
    """For each rule whose NVIDIA variable is set and whose target is not the user's own:
    (rule, the NVIDIA variable read, the chip's value or None where it cannot take it)."""
    marks = _marks(environ)
    found = []
    for rule in rules:
        name = next((n for n in rule.sources if n in environ), None)
        current = environ.get(rule.target)
        if name is None or (current is not None and marks.get(rule.target) != current):
            continue
        found.append((rule, name, rule.convert(environ[name])))
    return found


def translate(rules: Sequence[Counterpart], environ: MutableMapping[str, str] = os.environ
              ) -> Optional[Callable[[], None]]:
    """Set each rule's target from its NVIDIA variable (see the module rules); returns the undo,
    or None when nothing changed."""
    marks = _marks(environ)
    changes = {}
    for rule, name, value in planned(rules, environ):
        if value is None:
            log.warning("%s=%r is not translated to %s: %s takes no such value (%s)", name, environ[name],
                        rule.target, rule.target, rule.value)
        elif environ.get(rule.target) != value:
            changes[rule.target] = value
            log.info("%s=%s applied as %s=%s", name, environ[name], rule.target, value)
    if not changes:
        return None
    undo = variables.restorer(environ, (*changes, MARK))
    environ.update(changes)
    marks.update(changes)
    environ[MARK] = ";".join(f"{k}={v}" for k, v in sorted(marks.items()))

    return undo
