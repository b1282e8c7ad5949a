"""Chip models, as data: ``data/chip_models.json`` lists, per chip, the models a sim profile can
answer as (``FL_SIM_PROFILE=ascend:910a``) and the traits that differ between models of one
chip — the name its plugin reports, memory per device, bfloat16 and TF32 support — each with
where it was read. A chip named alone is its default model."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Dict, Mapping, Tuple

from ..data_files import read_json
from ..errors import ConfigError, suggestion



@dataclass(frozen=True)
class ChipModel:
    """One model of a chip: ``name`` (``"910a"``), what its plugin reports as its device name,
    its memory per device in bytes, whether it computes bfloat16 and TF32, and ``sources``
    (trait -> where it was read)."""
    chip: str
    name: str
    device_name: str
    memory: int
    bfloat16: bool
    tf32: bool
    sources: Mapping[str, str]

    @property
    def spec(self) -> str:
        """``"ascend:910a"``: how ``FL_SIM_PROFILE`` names it."""
        return f"{self.chip}:{self.name}"


@lru_cache(maxsize=None)
def _table() -> Mapping[str, Tuple[str, Mapping[str, ChipModel]]]:
    data = read_json("chip_models.json")
    table = {}
    for chip, entry in data["chips"].items():
        models = {name: ChipModel(chip, name, m["device_name"], int(m["memory_gib"]) << 30,
                                  bool(m["bfloat16"]), bool(m["tf32"]), MappingProxyType(dict(m["sources"])))
                  for name, m in entry["models"].items()}
        table[chip] = (entry["default"], MappingProxyType(models))
    return MappingProxyType(table)


def models(chip: str) -> Mapping[str, ChipModel]:
    """The models of ``chip`` by name (empty for a chip without models)."""
    found = _table().get(chip)
    return found[1] if found else MappingProxyType({})


def default_model(chip: str) -> ChipModel:
    """The model ``chip`` named alone stands for."""
    default, found = _table()[chip]
    return found[default]


def model(chip: str, name: str, source: str = "FL_SIM_PROFILE") -> ChipModel:
    """Model ``name`` of ``chip``; ConfigError naming ``source``, the closest and the valid
    models otherwise."""
    found = models(chip)
    if name not in found:
        valid = sorted(found)
        raise ConfigError(f"{source}: {name!r} is not a model of {chip}.{suggestion(name, valid)} "
                          f"Valid: {', '.join(f'{chip}:{m}' for m in valid) or f'{chip} (it has no models)'}")
    return found[name]


def all_models() -> Dict[str, Tuple[ChipModel, ...]]:
    """Every chip's models, default first."""
    return {chip: (default_model(chip), *(m for n, m in sorted(found.items()) if n != default))
            for chip, (default, found) in _table().items()}
