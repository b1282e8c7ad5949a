"""The semantic name table: friendly, framework and vendor names (``conv2d``, ``LayerNorm``,
``SDPA``, ``MatMulV2`` ...) and categories of common operations, mapped to ATen operators.

The table is data (``flagos_torchfl/data/op_names.json``); this module reads it and answers
"which ATen overloads does this name mean?" for overrides, reports, ``detect``'s category
coverage and ``FL_SIM_NATIVE_OPS``. Operator names are the dispatcher's: ``"aten::add.Tensor"``,
and for a default overload the bare ``"aten::relu"``.
"""
from __future__ import annotations

import functools
import re
from typing import Callable, Dict, FrozenSet, Iterable, List, Tuple

from ..data_files import read_json
from ..errors import ConfigError, closest
from ..log import get_logger
from .dispatcher import PREFIX, needs_backend_kernel, overloads_by_packet

log = get_logger("aten")

def _normalise(name: str) -> str:
    return re.sub(r"[\s_\-]", "", name).lower()


@functools.lru_cache(maxsize=1)
def table() -> dict:
    """The parsed data file: ``{"categories": {...}, "names": {...}}``."""
    return read_json("op_names.json")


def aten_overloads(entry: str) -> Tuple[str, ...]:
    """Overloads meant by an ATen spelling: ``add`` / ``aten::add`` (all overloads, the in-place
    ``add_`` ones too), ``add.Tensor`` (one), ``relu.default`` (the default one). Empty when this
    torch has none."""
    bare = entry[len(PREFIX):] if entry.startswith(PREFIX) else entry
    packet, dot, overload = bare.partition(".")
    found = overloads_by_packet().get(packet, ())
    if not dot:
        return found + overloads_by_packet().get(packet + "_", ()) if found else ()
    full = PREFIX + packet if overload == "default" else f"{PREFIX}{packet}.{overload}"
    return (full,) if full in found else ()


def categories() -> Dict[str, dict]:
    """Category name -> ``{"description", "ops", "check"}`` as in the data file."""
    return table()["categories"]


def newer_than_floor() -> Tuple[str, ...]:
    """Entries of the data file that the oldest supported torch does not have yet."""
    return tuple(table().get("newer_than_floor", {}).get("ops", ()))


def absent_entries(category: str) -> Tuple[str, ...]:
    """The ``ops`` and ``check`` entries of a category that this torch has no overload for."""
    entry = categories()[category]
    spelt = [*entry["ops"], *(alt for check in entry["check"] for alt in check.split("|"))]
    return tuple(dict.fromkeys(e for e in spelt if not aten_overloads(e)))


@functools.lru_cache(maxsize=None)
def category_ops(category: str) -> FrozenSet[str]:
    """Every overload (this torch has) that a category covers; entries this torch lacks are
    left out, and said in a debug log."""
    absent = absent_entries(category)
    if absent:
        log.debug("category %s: this torch has no %s (left out)", category, ", ".join(absent))
    ops: set = set()
    for entry in categories()[category]["ops"]:
        ops.update(aten_overloads(entry))
    return frozenset(ops)


@functools.lru_cache(maxsize=1)
def _semantic_index() -> Dict[str, Tuple[str, ...]]:
    """Normalised semantic name -> category names / ``aten::`` entries it stands for."""
    index: Dict[str, Tuple[str, ...]] = {}
    for category in categories():
        index[_normalise(category)] = (category,)
    for name, targets in table()["names"].items():
        index[_normalise(name)] = tuple(targets)
    return index


def semantic_names() -> List[str]:
    """Every category and friendly name as spelt in the data file."""
    return sorted({*categories(), *table()["names"]})


def _expand(targets: Iterable[str]) -> FrozenSet[str]:
    ops: set = set()
    for target in targets:
        if target.startswith(PREFIX):
            ops.update(aten_overloads(target))
        else:
            ops.update(category_ops(target))
    return frozenset(ops)


def _kernel_name(raw: str) -> bool:
    """True when ``raw`` spells an ATen operator with overloads that reach backends: such a
    name means that operator, not a semantic name spelt alike (``add``, ``tanh``, ``sort``)."""
    return any(needs_backend_kernel(o) for o in aten_overloads(raw))


def resolve_semantic(name: str) -> FrozenSet[str]:
    """Overloads a semantic name or category means (empty when it is not one, or when it spells
    an ATen operator that reaches backends). This is the ``resolve_name`` hook
    ``flagos_torchfl.sim.parse_native_ops`` accepts."""
    raw = str(name).strip()
    if "::" in raw or _kernel_name(raw):
        return frozenset()
    targets = _semantic_index().get(_normalise(raw))
    return _expand(targets) if targets else frozenset()


def resolve(name: str) -> FrozenSet[str]:
    """Overloads ``name`` means: an ATen operator that reaches backends (``add``, ``aten::gelu``,
    ``add.Tensor``), else a category or friendly name (``softmax``, ``LayerNorm``, ``conv2d``:
    any case, ``_``/``-`` ignored), else any ATen spelling. Raises :class:`ConfigError` listing
    the closest known names when it means nothing."""
    raw = str(name).strip()
    if not raw:
        raise ConfigError("empty operator name")
    if "::" in raw and not raw.startswith(PREFIX):
        raise ConfigError(f"unknown operator {raw!r}: only aten:: operators can be routed")
    found = resolve_semantic(raw) or frozenset(aten_overloads(raw))
    if found:
        return found
    raise ConfigError(f"unknown operator name {raw!r}.{_hint(raw)}")


def _hint(raw: str) -> str:
    bare = raw[len(PREFIX):] if raw.startswith(PREFIX) else raw
    by_form = {_normalise(n): n for n in semantic_names()}
    choices = closest(bare, [*semantic_names(), *overloads_by_packet()], n=5) or [
        by_form[c] for c in closest(_normalise(bare), by_form, n=3)
    ]
    choices = list(dict.fromkeys(choices))[:3]
    if not choices:
        return " Give a category or name from `python -m flagos_torchfl ops --names`, or an ATen operator."
    return " Did you mean " + " or ".join(repr(c) for c in choices) + "?"


def categories_of(op: str) -> List[str]:
    """The categories that cover overload ``op``."""
    return [c for c in categories() if op in category_ops(c)]


def category_is_native(category: str, runs: Callable[[str], bool]) -> bool:
    """Whether a chip runs ``category`` without routing: every ``check`` entry of the category
    has an alternative with an overload ``runs`` accepts (``runs``: has the chip a kernel for
    this overload?). A category without checks is made of composites every chip runs."""
    for entry in categories()[category]["check"]:
        if not any(any(runs(o) for o in aten_overloads(alt)) for alt in entry.split("|")):
            return False
    return True


def category_coverage(runs: Callable[[str], bool]) -> Tuple[List[str], List[str]]:
    """(categories the chip runs natively, categories that need routing)."""
    yes, no = [], []
    for category in categories():
        (yes if category_is_native(category, runs) else no).append(category)
    return yes, no
