"""The vendors' device modules as data: the public names of ``torch.npu`` / ``torch.mlu`` /
``torch.musa``, shipped as ``data/device_modules/<chip>.json`` (written by
``tools/device_modules.py``, whose docstring describes the format and the sources), and the count
of ``torch.cuda`` names a program used that its chip lacks (the verdict lists them)."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Dict, List, Mapping, Optional, Tuple

from ..data_files import names, read_json

_DIR = "device_modules"


@dataclass(frozen=True)
class DeviceModuleTable:
    """One chip's device module: ``names`` it offers publicly, the module read
    (``torch_npu.npu``), the torch device module it becomes (``torch.npu``) and ``source``."""
    chip: str
    module: str
    device_module: str
    names: frozenset
    torch_checked: str
    source: Mapping[str, str]

    @property
    def origin(self) -> str:
        """The release or revision the names were read from: ``torch-npu 2.13.0``."""
        source = self.source
        return f"{source.get('package') or source.get('repository')} {source.get('version') or source.get('ref')}"


def available() -> List[str]:
    """Chips with a device-module table, sorted."""
    return names(_DIR)


@lru_cache(maxsize=None)
def load(chip: str) -> Optional[DeviceModuleTable]:
    """The table of ``chip``, or None for a chip without one (its answers then come from the
    installed device module alone)."""
    if chip not in available():
        return None
    data = read_json(f"{_DIR}/{chip}.json")
    return DeviceModuleTable(chip=data["chip"], module=data["module"], device_module=data["device_module"],
                             names=frozenset(data["names"]), torch_checked=data["torch_checked"],
                             source=MappingProxyType(dict(data["source"])))


class _Uses:
    """``torch.cuda`` names used (called, instantiated, read into) that the chip lacks.
    ``counts`` ((chip, name) -> uses) belongs to one activation: the ``torch.cuda`` facade's
    patch gives each its own, and its undo takes it away."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: Dict[Tuple[str, str], int] = {}

    def record(self, chip: str, name: str) -> None:
        with self._lock:
            self.counts[(chip, name)] = self.counts.get((chip, name), 0) + 1

    def rows(self, chip: str) -> List[Tuple[str, int]]:
        """(name, uses) for ``chip``, most used first."""
        with self._lock:
            found = [(name, n) for (c, name), n in self.counts.items() if c == chip]
        return sorted(found, key=lambda row: (-row[1], row[0]))


#: every use of a ``torch.cuda`` name the chip lacks, in this process
missing_uses = _Uses()
