"""What names a sim profile and what it runs natively: the tables' side of the profiles
(:mod:`flagos_torchfl.backends.profile`), which the sim's options read (``FL_SIM_PROFILE``), the command line lists and
the registry resolves (:meth:`~.registry.Registry.profile`)."""
from __future__ import annotations

import functools
from types import MappingProxyType
from typing import FrozenSet, List, Mapping, Optional, Tuple

from .. import data_files
from ..errors import ConfigError, suggestion
from . import chip_models, op_tables


def profiles() -> List[str]:
    """Names of the chips that have a profile (those with an operator table), sorted."""
    return op_tables.available()


def check_profile(name: str, source: str = "FL_SIM_PROFILE") -> str:
    """``name`` if it names a profile — a chip (``ascend``) or one of its models
    (``ascend:910a``); ConfigError naming ``source``, the closest and the valid choices
    otherwise."""
    chip, _, model = name.partition(":")
    valid = profiles()
    if chip not in valid:
        raise ConfigError(f"{source} {name!r} is not a sim profile.{suggestion(chip, valid)} "
                          f"Valid: {', '.join(valid)} (or CHIP:MODEL: {', '.join(model_specs())})")
    if model:
        chip_models.model(chip, model, source)
    return name


def model_specs() -> List[str]:
    """``chip:model`` for every model of every profile's chip."""
    return [m.spec for chip in profiles() for m in chip_models.all_models().get(chip, ())]


def rename_problem(device_type: str) -> Optional[str]:
    """Why the sim could not take ``device_type`` as its device type name in this process
    (None: it can)."""
    from ..sim.integration.registration import rename_problem as problem

    return problem(device_type)


@functools.lru_cache(maxsize=None)
def known_table_ops(chip: str) -> Tuple[FrozenSet[str], Tuple[str, ...]]:
    """(the table's dense overloads this torch knows, those it does not). Tables are checked
    against the torch release that wrote them; another release may lack some names."""
    from ..aten.dispatcher import overloads_by_packet

    table = op_tables.load(chip)
    packets = overloads_by_packet()
    known, missing = set(), []
    for name in table.dense_ops:
        packet = name[len("aten::"):].partition(".")[0]
        (known.add(name) if name in packets.get(packet, ()) else missing.append(name))
    return frozenset(known), tuple(sorted(missing))


def native_set(profile: str) -> FrozenSet[str]:
    """The overloads the sim runs natively under ``profile`` (a chip, or ``chip:model``: every
    model of a chip has its table): the table's, less those the sim cannot give a kernel
    (CompositeImplicitAutograd ones decompose on every backend), plus the runtime primitives
    every device runtime has."""
    from ..sim.operators.native_ops import can_run_natively, runtime_primitive_names

    known, _ = known_table_ops(profile.partition(":")[0])
    return frozenset(n for n in known if can_run_natively(n)) | runtime_primitive_names()


@functools.lru_cache(maxsize=None)
def tensor_kinds(chip: str) -> Optional[Mapping[str, FrozenSet[str]]]:
    """Per sparse and quantized dispatch key of the device (:data:`flagos_torchfl.sim.TENSOR_KIND_KEYS`),
    the ``aten`` overloads ``chip``'s plugin registers a kernel for (``data/tensor_kinds.json``,
    each chip's entry citing its source); None for a chip the file does not describe."""
    from ..sim import TENSOR_KIND_KEYS

    entry = data_files.read_json("tensor_kinds.json")["chips"].get(chip)
    if entry is None:
        return None
    return MappingProxyType({key: frozenset(entry[key]) for key in TENSOR_KIND_KEYS})
