"""``sim``: a simulated accelerator on PyTorch's PrivateUse1 dispatch key, in three parts, each
importing only the ones before it: :mod:`.runtime` (its devices, memory, tensors, device module,
streams and graphs, with a C++ runtime built at first use: :mod:`.runtime.cpp`), :mod:`.operators`
(which operators it runs natively and the kernels that run them) and :mod:`.integration` (how both
are registered with torch). This module installs it.

After :func:`install`, ``torch.device("sim")`` is a device like any other: tensors live in memory
of their own (host memory managed by a per-device caching allocator, never shared with CPU
tensors; moving to and from the device copies bytes), autograd works, and ``torch.sim`` is the
device module (memory statistics, RNG, streams). Operators in the native set
(:func:`native_op_names`) run on the device by running PyTorch's CPU kernels on host views of the
device memory; every other operator has no kernel on the device, exactly as on a chip whose
runtime lacks it, which is what the routing layer is developed against.

The package reads no environment variable: the ``sim`` backend (``backends/sim.py``) turns
``FL_SIM_DEVICES`` and ``FL_SIM_NATIVE_OPS`` into :func:`install`'s arguments.
"""
from __future__ import annotations

import logging
import threading
import types
import warnings
from typing import Iterable, Mapping

import torch

from ..errors import ConfigError, suggestion
from .integration import registration
from .runtime import state, tensors
from .operators.native_ops import (RUNTIME_PRIMITIVES, can_run_natively, default_native_ops,
                                   parse_native_ops, resolve_exact, runtime_primitive_names)

__all__ = [
    "install", "is_installed", "native_op_names", "default_native_ops", "parse_native_ops",
    "set_memory_limit", "host_view", "RUNTIME_PRIMITIVES", "runtime_kind", "cpp_problem",
    "limit_tensor_kinds", "TENSOR_KIND_KEYS",
]

logger = logging.getLogger("flagos_torchfl.sim")

_lock = threading.Lock()
_installed: tuple[int, frozenset[str], str] | None = None

TENSOR_KIND_KEYS = ("SparsePrivateUse1", "SparseCsrPrivateUse1", "QuantizedPrivateUse1")
"""The sim's dispatch keys for sparse (COO, compressed) and quantized tensors."""
_tensor_kinds: Mapping[str, frozenset[str]] | None = None


def install(num_devices: int = 1, native_ops: Iterable[str] | None = None,
            memory_limit: int | None = None, device_type: str = "sim",
            device_name: str | None = None, bfloat16: bool = True,
            runtime: str = "auto") -> types.ModuleType:
    """Claim PyTorch's PrivateUse1 slot as device type ``device_type`` (``"sim"``, or a chip's
    name such as ``"npu"`` so that code written for that chip runs) and return its device module
    (also ``torch.<device_type>``). ``device_name``: what ``get_device_name`` answers (None:
    ``'flagos sim device'``). ``bfloat16``: whether the devices compute bfloat16 (False, as on
    a chip model without it: ``is_bf16_supported()`` is False and autocast takes float16 only).
    ``runtime``: the device runtime, ``"cpp"`` (the C++ runtime of :mod:`.runtime.cpp`: guard,
    hooks, allocators, built at first use; an error where it cannot be had), ``"python"`` (the
    Python guard) or ``"auto"`` (cpp where it can be had, else Python, with a warning);
    ``"native"``, the former name of ``"cpp"``, is accepted with a FutureWarning.

    ``num_devices``: number of sim devices (``sim:0`` ...). ``native_ops``: the overloads the
    devices run natively, fully qualified as :func:`parse_native_ops` and
    :func:`native_op_names` give them (``"aten::add.Tensor"``, ``"aten::relu"``; any other
    name is resolved as :func:`parse_native_ops` resolves it); None: :func:`default_native_ops`.
    Overloads that cannot have a sim kernel are dropped, and the runtime primitives
    (:data:`RUNTIME_PRIMITIVES`) are always added. ``memory_limit``: bytes
    each device may reserve (None: the nominal 16 GiB); :func:`set_memory_limit` changes it later.

    A repeated call returns the module when ``num_devices``, the native set and the device type
    equal the installed ones and ``memory_limit`` equals the limit in force; otherwise it raises
    :class:`~flagos_torchfl.errors.ConfigError` (the first three cannot change in a process).
    Raises :class:`~flagos_torchfl.errors.PrivateUse1ClaimedError` when another backend
    (e.g. torch_npu) holds PrivateUse1, and
    :class:`~flagos_torchfl.errors.BackendUnavailableError` when the installed PyTorch lacks
    what a Python PrivateUse1 backend needs or PrivateUse1 cannot take the name ``device_type``
    (:func:`~flagos_torchfl.sim.integration.registration.rename_problem` says why).
    """
    global _installed
    num_devices = _check_device_count(num_devices, "num_devices")
    _check_limit(memory_limit)
    if runtime in registration.RENAMED_MODES:
        warnings.warn(f"sim runtime {runtime!r} is deprecated: say {registration.RENAMED_MODES[runtime]!r}",
                      FutureWarning, stacklevel=2)
        runtime = registration.RENAMED_MODES[runtime]
    if runtime not in registration.RUNTIME_MODES:
        raise ConfigError(f"unknown sim runtime {runtime!r}.{suggestion(str(runtime), registration.RUNTIME_MODES)} "
                          f"Valid: {', '.join(registration.RUNTIME_MODES)}")
    native = _native_set(native_ops)
    with _lock:
        if _installed is not None:
            _check_same(num_devices, native, memory_limit, device_type, runtime)
            return getattr(torch, device_type)
        module = registration.claim(num_devices, memory_limit, native, device_type, device_name, bfloat16,
                                    runtime, _tensor_kinds)
        _installed = (num_devices, native, device_type)
    logger.info("sim: installed %d device(s) of type %r on PrivateUse1 with %d native operator "
                "overloads", num_devices, device_type, len(native))
    return module


def limit_tensor_kinds(kinds: Mapping[str, Iterable[str]] | None) -> None:
    """Serve on each of the sim's sparse and quantized dispatch keys (:data:`TENSOR_KIND_KEYS`)
    only the overloads ``kinds`` lists for it (``{"SparsePrivateUse1": ["aten::add.Tensor"]}``; a
    key it leaves out: none), as a chip whose plugin registers just those; the others are refused
    with the dispatcher's words for a missing kernel. None: every overload the sim can serve (the
    default). Call it before :func:`install`; afterwards only the kinds in force are accepted
    (:class:`~flagos_torchfl.errors.ConfigError` otherwise)."""
    global _tensor_kinds
    if kinds is not None:
        unknown = sorted(set(kinds) - set(TENSOR_KIND_KEYS))
        if unknown:
            raise ConfigError(f"unknown dispatch key(s) {', '.join(map(repr, unknown))} for sparse or quantized "
                              f"tensors; valid: {', '.join(TENSOR_KIND_KEYS)}")
        kinds = {key: frozenset(kinds.get(key, ())) for key in TENSOR_KIND_KEYS}
    with _lock:
        if _installed is not None and kinds != _tensor_kinds:
            raise ConfigError("the sim is already installed with other sparse and quantized kernels; they cannot "
                              "change in the same process")
        _tensor_kinds = kinds


def _native_set(native_ops: Iterable[str] | None) -> frozenset[str]:
    if native_ops is None:
        return default_native_ops()
    if isinstance(native_ops, str):
        raise ConfigError("native_ops must be an iterable of operator names, not a string; "
                          "use parse_native_ops() for a FL_SIM_NATIVE_OPS value")
    names: set[str] = set()
    for name in native_ops:
        names.update(n for n in resolve_exact(name) if can_run_natively(n))
    return frozenset(names | runtime_primitive_names())


def _check_same(num_devices: int, native: frozenset[str], memory_limit: int | None,
                device_type: str, kind: str) -> None:
    installed_devices, installed_native, installed_type = _installed
    if kind not in ("auto", runtime_kind()):
        raise ConfigError(f"the sim is already installed with its {runtime_kind()} runtime; it cannot "
                          f"change to {kind!r} in the same process")
    if device_type != installed_type:
        raise ConfigError(
            f"the sim is already installed as device type {installed_type!r}; it cannot be "
            f"reinstalled as {device_type!r} in the same process")
    if num_devices != installed_devices:
        raise ConfigError(
            f"the sim is already installed with {installed_devices} device(s); it cannot be "
            f"reinstalled with {num_devices} in the same process")
    if native != installed_native:
        added = sorted(native - installed_native)[:5]
        removed = sorted(installed_native - native)[:5]
        raise ConfigError(
            "the sim is already installed with a different native operator set; it cannot change "
            f"in the same process (would add {added or 'nothing'}, remove {removed or 'nothing'})")
    current = state.allocator(0).limit
    if memory_limit != current:
        raise ConfigError(
            f"the sim is already installed with memory limit {current}; use "
            f"flagos_torchfl.sim.set_memory_limit({memory_limit}) to change it")


def _check_device_count(value: object, source: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{source} must be an integer >= 1, got {value!r}")
    if value < 1:
        raise ConfigError(f"{source} must be >= 1, got {value}")
    return value


def _check_limit(limit: object) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"memory limit must be None or a number of bytes >= 0, got {limit!r}")


def runtime_kind() -> str | None:
    """The installed sim's device runtime: ``"cpp"`` or ``"python"``; None before install."""
    if _installed is None:
        return None
    return "python" if state.cpp_runtime() is None else "cpp"


def cpp_problem() -> str | None:
    """Why ``runtime="auto"`` ran the sim with its Python guard in this process (None: it did
    not)."""
    return registration.cpp_problem()


def is_installed() -> bool:
    """Whether :func:`install` has run in this process."""
    return _installed is not None


def native_op_names() -> frozenset[str]:
    """Fully qualified overload names (``"aten::add.Tensor"``, ``"aten::relu"``) that have a sim
    kernel; empty before :func:`install`."""
    return frozenset() if _installed is None else _installed[1]


def set_memory_limit(limit_bytes: int | None) -> None:
    """Limit every sim device to ``limit_bytes`` reserved bytes (None lifts the limit; existing
    tensors above a lowered limit stay valid, new allocations fail)."""
    _check_limit(limit_bytes)
    if _installed is None:
        raise RuntimeError("the sim is not installed: call flagos_torchfl.sim.install() first")
    for alloc in state.allocators():
        alloc.set_limit(limit_bytes)


def host_view(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor aliasing sim tensor ``t``'s bytes, with its dtype, size, stride and offset
    (the raw bytes: a conjugate or negative view bit of ``t`` is not carried over). Writes
    through it change ``t``; it keeps ``t``'s memory alive, but no longer sees ``t``'s bytes
    once ``t``'s storage has been resized (``resize_`` growing it, ``storage.resize_``)."""
    return tensors.host_view(t)
