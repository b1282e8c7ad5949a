"""The vendors' published operator tables, shipped as ``data/chips/<chip>.json`` (written by
``tools/chip_tables.py``, whose docstring describes the format)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import List, Mapping, Tuple

from ..data_files import names, read_json
from ..errors import ConfigError, suggestion

_DIR = "chips"


@dataclass(frozen=True)
class OpTable:
    """One chip's table. ``ops``: ATen overloads (dispatcher spelling, ``aten::add.Tensor``) the
    vendor implements and the torch of ``torch_checked`` knows; ``unknown``: listed names that torch
    did not know; ``only_for``: names implemented only for other tensor kinds (``quantized``,
    ``sparse``, ``sparse_csr``, ``nested``) than dense device tensors; ``vendor_ops``: the vendor's
    own operators; ``source``: where the table came from."""
    chip: str
    device_type: str
    ops: frozenset
    unknown: Tuple[str, ...]
    only_for: Mapping[str, Tuple[str, ...]]
    vendor_ops: Tuple[str, ...]
    torch_checked: str
    source: Mapping[str, str]

    @property
    def dense_ops(self) -> frozenset:
        """``ops`` that run on ordinary (dense) device tensors."""
        return self.ops.difference(self.only_for)


def available() -> List[str]:
    """Names of the chips with a table, sorted."""
    return names(_DIR)


def load(chip: str) -> OpTable:
    """The table of ``chip``. Raises ConfigError naming the valid chips (and the closest one)
    for a chip without a table."""
    valid = available()
    if chip not in valid:
        raise ConfigError(f"no operator table for chip {chip!r}.{suggestion(chip, valid)} "
                          f"Valid chips: {', '.join(valid)}")
    return _load(chip)


@lru_cache(maxsize=None)
def _load(chip: str) -> OpTable:
    data = read_json(f"{_DIR}/{chip}.json")
    return OpTable(
        chip=data["chip"],
        device_type=data["device_type"],
        ops=frozenset(data["ops"]),
        unknown=tuple(data["unknown_to_torch"]),
        only_for=MappingProxyType({k: tuple(v) for k, v in data["only_for"].items()}),
        vendor_ops=tuple(data["vendor_ops"]),
        torch_checked=data["torch_checked"],
        source=MappingProxyType(dict(data["source"])),
    )
