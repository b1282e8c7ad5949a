"""Which ATen operators the sim runs natively, and how ``FL_SIM_NATIVE_OPS`` names them.

Names are fully qualified overload names as the dispatcher spells them: ``"aten::add.Tensor"``,
and for a default overload the bare operator, ``"aten::relu"``.
"""
from __future__ import annotations

import functools
import json
import logging
import os
import re
from typing import Callable, Iterable

from ...aten.dispatcher import (all_aten, cached, has_computed_kernel, has_kernel, is_implicit,
                                overloads_by_packet, schema_of, tagged)
from ...errors import ConfigError, closest
from . import kernels
from .kernels import HOST_EQUIVALENTS, SPECIAL_KERNELS

logger = logging.getLogger("flagos_torchfl.sim")

RUNTIME_PRIMITIVES: tuple[str, ...] = (
    # memory
    "empty.memory_format", "empty_strided", "resize_", "resize_as_", "set_",
    # copies between the device, the host and other devices
    "copy_", "_copy_from.default", "_copy_from_and_resize.default", "_to_copy", "clone",
    # views that need the device (the others PyTorch builds for every backend, see below), and
    # whether two tensors are the same view of the same memory
    "as_strided", "view.default", "_reshape_alias", "_unsafe_view", "is_set_to",
    # scalars
    "_local_scalar_dense", "fill_.Scalar", "fill_.Tensor", "zero_",
    # streams
    "record_stream",
)
"""Operators a device runtime must provide itself, whatever else is native.

Every device backend implements these in its runtime rather than as compute kernels: allocation
(``empty*``, ``resize_``, ``set_``), moving bytes between host and device and between devices
(``copy_``, ``_copy_from*``, ``_to_copy``, ``clone``), the view primitives that other views are
built from (``as_strided``, ``view``, ``_reshape_alias``) and ``is_set_to`` (a question about
storages, which no host copy can answer), reading/writing a scalar
(``_local_scalar_dense``, ``fill_``, ``zero_``) and ``record_stream`` (a no-op: sim work runs
inline). Without them a tensor cannot even be created on or moved to the device, so
:func:`flagos_torchfl.sim.install` always adds them to the native set.
``alias``, ``detach``, ``lift_fresh``, ``expand``, ``permute`` and the other views PyTorch
implements for every backend need no kernel (see :func:`can_run_natively`).
"""

RANDOM_OPS: tuple[str, ...] = (
    "normal_", "uniform_", "bernoulli_", "bernoulli", "random_", "exponential_", "cauchy_",
    "log_normal_", "geometric_", "normal", "multinomial",
)
"""Samplers that PyTorch's random factories (``rand_like``, ``randint``, ``randn_like`` ...) and
``torch.nn.init`` run on the tensor's own device; in the default set so that random numbers on
the sim come from the sim's own per-device generators (``torch.sim.manual_seed``)."""

DISPLAY_OPS: tuple[str, ...] = ("masked_select", "view_as_real")
"""Operators PyTorch's tensor printing (``torch._tensor_str``) runs on the tensor's own device
beyond the Core ATen set; in the default set so that ``print(t)`` works on the sim."""


@functools.lru_cache(maxsize=None)
def can_run_natively(name: str) -> bool:
    """Whether overload ``name`` can get a sim kernel.

    Either the sim implements it itself (allocation, copies, ``set_``, ``resize_``, and the
    ``*_overrideable`` stubs of :data:`~.kernels.HOST_EQUIVALENTS`), or it must have a CPU kernel
    (the sim runs it on host views) and be none of:

    * another ``*_overrideable`` stub: its CPU kernel only raises;

    * CompositeImplicitAutograd: it decomposes into other operators on every backend, and a
      backend kernel for it would hide the decomposition from autograd (its gradient would be
      lost);
    * a view (a return aliasing an input) with a CompositeExplicitAutograd kernel (``alias``,
      ``detach``, ``expand``, ``permute``, ``select`` ...): PyTorch builds it for every backend
      from the input's storage, and a Python kernel would hand back a tensor that already has a
      Python object, which ``nn.Parameter`` and ``Tensor.as_subclass`` refuse.
    """
    if name in SPECIAL_KERNELS or name in HOST_EQUIVALENTS:
        return True
    if "_overrideable" in name:
        return False
    if is_implicit(name):
        return False
    if has_kernel(name, "CompositeExplicitAutograd") and _is_view(name):
        return False
    if not has_computed_kernel(name, "CPU"):
        return False
    functional = _functional_of_generated_out(name)
    return functional is None or has_computed_kernel(
        functional, "CPU")


def _functional_of_generated_out(name: str) -> str | None:
    """For an ``.out`` overload that only has PyTorch's generated composite kernel (which calls
    the functional overload and copies), the functional overload's name; else None."""
    packet, _, suffix = name.partition(".")
    if not suffix.endswith("out") or has_kernel(name, "CPU"):
        return None
    base = suffix[:-len("out")].rstrip("_")
    functional = f"{packet}.{base}" if base else packet
    known = overloads_by_packet().get(packet[len("aten::"):], ())
    return functional if functional in known else None


def _is_view(name: str) -> bool:
    returns = schema_of(name).returns
    return any(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _core_overloads() -> set[str]:
    """Every overload of every operator with an overload tagged ``core`` (strings only: building
    a table of packets here made container objects enough to set off a full garbage collection
    of the freshly imported torch, a tenth of a second)."""
    core_packets = {_packet(n) for n in tagged("core")}
    return {n for n in all_aten() if _packet(n) in core_packets}


def _packet(name: str) -> str:
    dot = name.find(".")
    return name if dot < 0 else name[:dot]


@functools.lru_cache(maxsize=1)
def device_kernel_ops() -> frozenset[str]:
    """A CUDA-like native set, wider than :func:`default_native_ops`: the default set plus the
    overloads a device runtime implements as kernels of its own, as CUDA does: those with a CPU
    kernel of their own (not a composite that serves every backend: ``lerp``, ``addcmul``,
    ``gelu_backward``, the losses), and the multi-tensor (``_foreach_*``) and fused optimizer
    (``_fused_*``) kernels that optimizers run on an accelerator; only the overloads
    :func:`can_run_natively` accepts. (``FL_SIM_NATIVE_OPS`` can name them, e.g. a file that
    lists them.)"""
    names = {n for n in all_aten()
             if has_kernel(n, "CPU") or n.startswith(("aten::_foreach_", "aten::_fused_adam", "aten::_fused_sgd"))}
    return default_native_ops() | frozenset(n for n in names if can_run_natively(n))


@functools.lru_cache(maxsize=1)
def default_native_ops() -> frozenset[str]:
    """The default native set: every overload of every operator PyTorch tags ``core`` (the Core
    ATen opset, ``.out`` variants included: their kernels run the CPU ``.out`` kernel on host
    views and never re-enter themselves), :data:`RUNTIME_PRIMITIVES`, :data:`RANDOM_OPS` and
    :data:`DISPLAY_OPS`, keeping only the overloads :func:`can_run_natively` accepts. Cached on
    disk with :func:`runtime_primitive_names` (:func:`_derived_sets`)."""
    return _derived_sets()["default"]


@functools.lru_cache(maxsize=1)
def runtime_primitive_names() -> frozenset[str]:
    """:data:`RUNTIME_PRIMITIVES` as fully qualified names (those :func:`can_run_natively`
    accepts)."""
    return _derived_sets()["primitives"]


@functools.lru_cache(maxsize=1)
def _derived_sets() -> dict[str, frozenset[str]]:
    """The default native set and the runtime primitives' names, read from the dispatcher once
    per torch build and source of the rules that derive them (this module's and
    :mod:`.kernels`'), then kept on disk (:func:`~flagos_torchfl.aten.dispatcher.cached`):
    deriving them means resolving every packet's overloads and asking the dispatcher about
    hundreds of them, a few tens of milliseconds at activation."""
    def build(names) -> dict[str, list]:
        primitives = _resolved(RUNTIME_PRIMITIVES)
        default = (_core_overloads() | primitives | _resolved(RANDOM_OPS + DISPLAY_OPS))
        return {"default": sorted(n for n in default if can_run_natively(n)),
                "primitives": sorted(n for n in primitives if can_run_natively(n))}

    stored = cached("native", ("default", "primitives"), build, salt=_rules_source())
    return {key: frozenset(stored[key]) for key in ("default", "primitives")}


def _resolved(entries: Iterable[str]) -> set[str]:
    names: set[str] = set()
    for entry in entries:
        names.update(resolve_aten_name(entry))
    return names


def _rules_source() -> tuple[str, ...]:
    """The source of the rules behind :func:`_derived_sets` (an empty source where a file cannot
    be read: the cache is then keyed by the torch build alone)."""
    texts = []
    for path in (__file__, kernels.__file__):
        try:
            with open(path, encoding="utf-8") as f:
                texts.append(f.read())
        except OSError:
            texts.append("")
    return tuple(texts)


def resolve_aten_name(name: str) -> tuple[str, ...]:
    """Fully qualified overloads meant by ``name``: ``add`` / ``aten::add`` (all overloads),
    ``add.Tensor`` / ``aten::add.Tensor`` (one), ``relu.default`` (the default overload).
    Raises :class:`ConfigError` naming the closest matches for an unknown name."""
    raw = name.strip()
    bare = raw[len("aten::"):] if raw.startswith("aten::") else raw
    if "::" in bare or not bare:
        raise ConfigError(f"unknown ATen operator {raw!r}: only aten:: operators can be native")
    packet, dot, overload = bare.partition(".")
    table = overloads_by_packet()
    if packet not in table:
        raise ConfigError(f"unknown ATen operator {raw!r}.{_hint(packet, table)}")
    if not dot:
        return table[packet]
    full = f"aten::{packet}" if overload == "default" else f"aten::{packet}.{overload}"
    if full not in table[packet]:
        choices = [n[len("aten::"):] for n in table[packet]]
        raise ConfigError(
            f"unknown overload {raw!r} of aten::{packet}.{_hint(bare, choices)} "
            f"Its overloads: {', '.join(choices)}"
        )
    return (full,)


def resolve_exact(name: str) -> tuple[str, ...]:
    """``name`` itself if it is a fully qualified overload name (``"aten::add.Tensor"``,
    ``"aten::relu"``, as :func:`parse_native_ops` returns them), else what
    :func:`resolve_aten_name` makes of it."""
    packet = name[len("aten::"):].partition(".")[0] if name.startswith("aten::") else None
    if packet is not None and name in overloads_by_packet().get(packet, ()):
        return (name,)
    return resolve_aten_name(name)


def _hint(name: str, choices: Iterable[str]) -> str:
    found = closest(name, choices, n=3)
    if not found:
        return ""
    return " Did you mean " + " or ".join(repr(f) for f in found) + "?"


def parse_native_ops(spec: str,
                     resolve_name: Callable[[str], Iterable[str]] | None = None) -> frozenset[str]:
    """The native set described by ``spec`` (the value of ``FL_SIM_NATIVE_OPS``).

    ``spec`` is either a comma-separated list of operator names (see :func:`resolve_aten_name`)
    or the path of a file: a text file with one or more names per line (``#`` starts a comment)
    or a JSON file holding a list of names or an object whose ``"native_ops"`` key holds one.

    ``resolve_name``, when given, is asked first about every name; a non-empty answer replaces
    the name by the names it lists (so a caller can offer categories or aliases), which are then
    resolved as ATen names. Overloads that cannot run natively (:func:`can_run_natively`) are
    dropped. Raises :class:`ConfigError` for an unknown name or one that cannot be an operator
    name, a missing, unreadable or malformed file, or a list that names nothing. Linear in the
    number of names: each distinct name is resolved once.
    """
    names = _read_names(spec)
    if not names:
        raise ConfigError(f"FL_SIM_NATIVE_OPS={spec.strip()!r} names no operator; give operator names, "
                          "categories or a file listing them (unset it for the default set)")
    distinct = dict.fromkeys(names)
    bad = next((n for n in distinct if not _OPERATOR_NAME.fullmatch(n)), None)
    if bad is not None:
        raise ConfigError(f"{bad[:80]!r} in FL_SIM_NATIVE_OPS is not an operator name "
                          "(e.g. 'add', 'aten::add.Tensor', 'softmax')")
    result: set[str] = set()
    for name in distinct:
        expanded = list(resolve_name(name) or ()) if resolve_name is not None else []
        for entry in expanded or [name]:
            result.update(resolve_aten_name(entry))
    kept = frozenset(n for n in result if can_run_natively(n))
    dropped = sorted(result - kept)
    if dropped:
        logger.debug("sim: %d overload(s) cannot be native and run by decomposition or not at "
                     "all: %s", len(dropped), ", ".join(dropped))
    return kept


#: what a native-ops entry can be: an ATen name with an optional overload, or a semantic name
#: (letters, digits, ``_``, ``-``, spaces inside)
_OPERATOR_NAME = re.compile(r"(?:aten::)?[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)?|[A-Za-z][A-Za-z0-9_\- ]*")


def _looks_like_path(spec: str) -> bool:
    return os.sep in spec or "/" in spec or spec.lower().endswith((".json", ".txt"))


def _read_names(spec: str) -> list[str]:
    spec = spec.strip()
    if os.path.isdir(spec):
        raise ConfigError(f"FL_SIM_NATIVE_OPS names a directory, not a file: {spec!r}")
    if os.path.isfile(spec):
        return _read_file(spec)
    if _looks_like_path(spec):
        raise ConfigError(f"FL_SIM_NATIVE_OPS names a file that does not exist: {spec!r}")
    return [n.strip() for n in spec.split(",") if n.strip()]


def _read_file(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"native op file {path!r} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"native op file {path!r} cannot be read: {exc.strerror or exc}") from None
    if path.lower().endswith(".json") or text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"native op file {path!r} is not valid JSON: {e}") from None
        if isinstance(data, dict):
            if "native_ops" not in data:
                raise ConfigError(
                    f"native op file {path!r}: a JSON object must hold the list under "
                    f"'native_ops' (keys found: {', '.join(sorted(map(str, data))) or 'none'})"
                )
            data = data["native_ops"]
        if not isinstance(data, list) or not all(isinstance(n, str) for n in data):
            raise ConfigError(f"native op file {path!r} must hold a list of operator names")
        return [n.strip() for n in data if n.strip()]
    if "#" in text:
        text = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    return [n for n in map(str.strip, text.replace("\n", ",").split(",")) if n]
