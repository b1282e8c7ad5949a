"""Claiming PyTorch's PrivateUse1 slot for the sim (what
``torch.utils.backend_registration._setup_privateuseone_for_python_backend`` does, with the
sim's own device module, device guard and hooks, plus serialization and native kernels)."""
from __future__ import annotations

import atexit
import logging
import sys
import types
from typing import Iterable, Mapping

import torch
import torch.serialization

from ... import compat, threads
from ...aten.dispatcher import has_backend_fallback, tagged, with_generator
from ...errors import BackendUnavailableError, PrivateUse1ClaimedError
from ...registrations import keep_at_exit
from ..operators import kernels, quantized, sparse
from ..runtime import cpp, state, tensors
from ..runtime.allocator import CachingAllocator
from ..runtime import device as device_module
from . import inductor, torch_patches

logger = logging.getLogger("flagos_torchfl.sim")

_UNCLAIMED = "privateuseone"

_keep_alive: list[object] = []


def _guard_and_hooks() -> tuple[object, object]:
    """The device guard and hooks PyTorch's C++ side uses for PrivateUse1. Only the device type
    and availability come from Python; the rest is fixed in C++ (device 0, one device, inline
    streams), which :mod:`flagos_torchfl.sim.integration.torch_patches` makes up for where it shows."""

    class DeviceGuard(torch._C._acc.DeviceGuard):
        def type_(self):
            return torch._C._autograd.DeviceType.PrivateUse1

    class Hooks(torch._C._acc.PrivateUse1Hooks):
        def is_available(self) -> bool:
            return state.device_count() > 0

        def has_primary_context(self, dev_id: int) -> bool:
            return 0 <= dev_id < state.device_count()

        def is_built(self) -> bool:
            return True

    return DeviceGuard(), Hooks()


RUNTIME_MODES = ("auto", "cpp", "python")
#: former names of runtime modes -> the mode
RENAMED_MODES = {"native": "cpp"}

_cpp_problem: str | None = None


def cpp_problem() -> str | None:
    """Why the sim runs with its Python guard in this process (None: it does not, or it was
    asked to)."""
    return _cpp_problem


def _cpp_runtime(mode: str, device_type: str) -> cpp.CppRuntime | None:
    """The C++ runtime to register for ``mode`` (None: the Python guard)."""
    global _cpp_problem
    if mode == "python":
        return None
    try:
        return cpp.load()
    except cpp.CppUnavailable as exc:
        if mode == "cpp":
            raise BackendUnavailableError(device_type, f"the sim's C++ runtime cannot be had: {exc}") from exc
        _cpp_problem = str(exc)
        logger.warning("sim: running with its Python device guard, which answers fewer of PyTorch's "
                       "questions (streams and events per device, torch.accelerator.device_index, "
                       "pinned memory, the profiler): %s", exc)
        return None


def _register_cpp(cpp_runtime: cpp.CppRuntime, num_devices: int, bfloat16: bool) -> None:
    try:
        cpp_runtime.register(num_devices, bfloat16)
    except cpp.CppUnavailable as exc:
        raise PrivateUse1ClaimedError(str(exc)) from exc
    state.use_cpp(cpp_runtime)
    device_module.use_cpp_streams()
    try:
        cpp_runtime.install_memory(state.allocators())
    except cpp.CppUnavailable as exc:
        raise BackendUnavailableError(state.DEVICE_TYPE, f"the sim's C++ runtime cannot hold its memory: {exc}") from exc


CPP_RUNTIME_KERNELS = frozenset({
    "aten::empty.memory_format", "aten::empty_strided", "aten::copy_", "aten::_copy_from",
})
"""Runtime primitives the C++ runtime implements in C++ (the rest of
:data:`~.kernels.SPECIAL_KERNELS` stay Python's: ``set_``, ``resize_`` and their kin)."""


def _register_python_kernels(library: torch.library.Library, names: Iterable[str]) -> None:
    """Register the Python kernel of each overload in ``names`` on PrivateUse1, each built at its
    first call (building one reads the overload's schema through its Python packet, which costs
    milliseconds apiece at activation)."""
    for name in sorted(names):
        library.impl(name[len("aten::"):], _BuiltAtFirstCall(name), "PrivateUse1")


class _BuiltAtFirstCall:
    """The Python kernel of one overload, built (:func:`kernels.kernel_for`, observed) when it is
    first called. One small object per overload: the sim registers some hundreds at start."""
    __slots__ = ("name", "kernel")

    def __init__(self, name: str):
        self.name, self.kernel = name, None

    def __call__(self, *args, **kwargs):
        kernel = self.kernel
        if kernel is None:
            kernel = self.kernel = kernels._observed(self.name, kernels.kernel_for(self.name))
        return kernel(*args, **kwargs)


#: operators torch tags random that draw no number: the attention's choice of kernel, and the
#: host's flash attention, whose kernel refuses a dropout
DRAWS_NOTHING = frozenset({"aten::_fused_sdp_choice", "aten::_scaled_dot_product_flash_attention_for_cpu"})


def cpp_route(names: Iterable[str]) -> frozenset[str]:
    """The overloads of ``names`` that the C++ runtime's C++ kernel serves: all but the
    runtime's Python primitives, the ``*_overrideable`` stubs (which run another operator) and
    random operators (which draw from the device's generator, a Python object), but for those
    tagged random that draw nothing (``DRAWS_NOTHING``)."""
    chosen = set()
    for name in names:
        if name in kernels.SPECIAL_KERNELS:
            if name in CPP_RUNTIME_KERNELS:
                chosen.add(name)
            continue
        if name in kernels.HOST_EQUIVALENTS:
            continue
        if (name in tagged("nondeterministic_seeded") or name in with_generator()) and name not in DRAWS_NOTHING:
            continue
        chosen.add(name)
    return frozenset(chosen)


def _register_python_guard() -> None:
    guard, hooks = _guard_and_hooks()
    if not torch._C._acc.register_python_privateuseone_hook(hooks):
        raise PrivateUse1ClaimedError("PrivateUse1 hooks are already registered by another backend")
    if not torch._C._acc.register_python_privateuseone_device_guard(guard):
        raise PrivateUse1ClaimedError(
            "a PrivateUse1 device guard is already registered by another backend")
    _keep_alive.extend([hooks, guard])


def _vendor_of(name: str) -> str | None:
    """The package that registered device type ``name``: the top package of its device module
    (``torch.npu`` is ``torch_npu.npu``), else a loaded ``torch_<name>`` plugin."""
    module = getattr(torch, name, None)
    root = getattr(module, "__name__", "").split(".")[0]
    if root and root != "torch":
        return root
    return f"torch_{name}" if f"torch_{name}" in sys.modules else None


def rename_problem(device_type: str) -> str | None:
    """Why the sim could not take the device type name ``device_type`` in this process (None when
    it can): PyTorch's PrivateUse1 slot already has another name, the name is one of PyTorch's
    own device types, or ``torch.<name>`` / ``Tensor.<name>`` already belong to something else."""
    current = torch._C._get_privateuse1_backend_name()
    if current == device_type:
        return None
    if current != _UNCLAIMED:
        return f"PyTorch's PrivateUse1 device type is already named {current!r} in this process"
    try:
        torch.device(device_type)
    except RuntimeError:
        pass
    else:
        return f"{device_type!r} is one of PyTorch's own device types"
    holder = getattr(torch, device_type, None)
    if holder is not None and holder is not device_module:
        return f"torch.{device_type} already exists ({getattr(holder, '__name__', type(holder).__name__)})"
    if hasattr(torch.Tensor, device_type):
        return f"torch.Tensor.{device_type} already exists"
    return None


def current_owner() -> str | None:
    """Who holds the PrivateUse1 slot, in words, or None if it is free or the sim's."""
    name = torch._C._get_privateuse1_backend_name()
    if name == state.DEVICE_TYPE:
        module = getattr(torch, name, None)
        if module is None or module is device_module:
            return None
        return f"backend {name!r} (device module {getattr(module, '__name__', module)!r})"
    if name != _UNCLAIMED:
        vendor = _vendor_of(name)
        return f"backend {name!r}" + (f" (registered by {vendor})" if vendor else "")
    if getattr(torch, _UNCLAIMED, None) is not None:
        return f"an unnamed PrivateUse1 backend with device module {getattr(torch, _UNCLAIMED)!r}"
    if has_backend_fallback("PrivateUse1"):
        return "an unnamed PrivateUse1 backend that registered a backend fallback"
    return None


def claim(num_devices: int, memory_limit: int | None, native: Iterable[str],
          device_type: str = "sim", device_name: str | None = None,
          bfloat16: bool = True, runtime_mode: str = "auto",
          tensor_kinds: Mapping[str, frozenset[str]] | None = None) -> types.ModuleType:
    """Register the sim on PrivateUse1 as device type ``device_type``; returns the device module
    (``torch.<device_type>``). ``runtime_mode``: ``"cpp"`` registers the C++ runtime
    (:mod:`..runtime.cpp`) and fails when it cannot be built or loaded, ``"python"`` the Python guard
    and hooks, ``"auto"`` the C++ runtime where it can be had, else the Python guard with one
    warning saying why. ``tensor_kinds``: the overloads each sparse and quantized key serves
    (:func:`flagos_torchfl.sim.limit_tensor_kinds`; None: all the sim can; a key serving none
    gets no kernel at all). Raises :class:`PrivateUse1ClaimedError` if another backend holds the
    slot, :class:`BackendUnavailableError` if the slot cannot take that name
    (:func:`rename_problem`) or the C++ runtime was required and cannot be had."""
    missing = compat.sim_missing()
    if missing:
        raise BackendUnavailableError(
            state.DEVICE_TYPE,
            f"PyTorch {torch.__version__} lacks {', '.join(missing)}; the sim needs a newer "
            "PyTorch (2.13 is tested)")
    owner = current_owner()
    if owner is not None:
        raise PrivateUse1ClaimedError(
            f"cannot install the sim device: PyTorch's single PrivateUse1 slot is already taken "
            f"by {owner}. One process can host one PrivateUse1 backend; run the sim in a process "
            "that does not load that backend."
        )
    problem = rename_problem(device_type)
    if problem:
        raise BackendUnavailableError(device_type, f"the sim cannot be device type {device_type!r}: {problem}")
    cpp_runtime = _cpp_runtime(runtime_mode, device_type)
    state.set_device_type(device_type, device_name, bfloat16)
    state.start(num_devices, memory_limit, cpp_runtime.new_allocator if cpp_runtime is not None else CachingAllocator)
    name = state.DEVICE_TYPE
    if torch._C._get_privateuse1_backend_name() != name:
        torch.utils.rename_privateuse1_backend(name)
    if not hasattr(torch.Tensor, name):
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True)
    if getattr(torch, name, None) is None:
        torch._register_device_module(name, device_module)
    if cpp_runtime is not None:
        _register_cpp(cpp_runtime, num_devices, bfloat16)
    else:
        _register_python_guard()
    # the autograd engine's device thread frees a backward's graph task after the backward has
    # returned, and with it Python objects: the contextvars context its captured thread-local
    # state holds and, with the Python guard, the blocks of device storages; it finishes before
    # the interpreter does
    atexit.register(threads.settle, threads.autograd_device_threads, "the autograd engine's device threads")
    library = keep_at_exit(torch.library.Library("aten", "IMPL"))
    in_cpp = cpp_route(native) if cpp_runtime is not None else frozenset()
    _register_python_kernels(library, frozenset(native) - in_cpp)
    if in_cpp:
        cpp_runtime.register_kernels(in_cpp)
    served = None if tensor_kinds is None else (lambda key, name: name in tensor_kinds[key])
    for key in (*sparse.lazy_keys(served), quantized.lazy_key(served)):
        if tensor_kinds is None or tensor_kinds[key.key]:
            key.install(_keep_alive)
    _declare_shallow_copy_compatible(library)
    _ask_attention_choice(library)
    _keep_alive.extend([library, _autocast_fallthrough()])
    torch.serialization.register_package(19, _sim_tag, _sim_restore)
    torch_patches.apply(num_devices, cpp=cpp_runtime is not None)
    device_module.listen_for_absent_attributes(inductor.asked_for)
    inductor.register_if_loaded()
    return device_module


def _declare_shallow_copy_compatible(library: torch.library.Library) -> None:
    """Declare dense sim and CPU tensors able to take over each other's ``.data``, as torch_npu
    and torch_mlu declare for their devices: ``Module.to``/``.cuda()``/``.half()`` then keep
    each Parameter object (``param.data = moved``), as on CUDA. Without it PyTorch counts a
    PrivateUse1 tensor incompatible with a CPU one and puts a new Parameter in each module."""

    def dense(tensor: torch.Tensor) -> bool:
        return (tensor.device.type in ("cpu", state.DEVICE_TYPE) and tensor.layout == torch.strided
                and not tensor.is_quantized and not tensor.is_nested)

    def compatible(self: torch.Tensor, other: torch.Tensor) -> bool:
        return dense(self) and dense(other)

    for key in ("PrivateUse1", "AutogradPrivateUse1"):
        library.impl("_has_compatible_shallow_copy_type", compatible, key)


def _ask_attention_choice(library: torch.library.Library) -> None:
    """``scaled_dot_product_attention`` on the sim refuses, as the CPU does, when the program has
    disabled both backends the host's kernels have (math and flash: ``sdpa_kernel([])``):
    PyTorch's composite skips the choice on a PrivateUse1 device without a C++ choice of its own
    and ran math even then, where a device raises "No viable backend". Otherwise the attention
    stays PyTorch's composite (the flags are read, no operator is called, so tracing sees the
    composite alone): math, or the host's flash kernel where the C++ runtime registered the
    device's choice (:data:`~..runtime.cpp.FUSED_ATTENTION`)."""
    op = torch.ops.aten.scaled_dot_product_attention.default

    def scaled_dot_product_attention(*args, **kwargs):
        if not (torch.backends.cuda.math_sdp_enabled() or torch.backends.cuda.flash_sdp_enabled()):
            raise RuntimeError("No viable backend for scaled_dot_product_attention was found. This is likely "
                               "due to turning off both the math kernel and the fused kernels.")
        return op.decompose(*args, **kwargs)

    library.impl("scaled_dot_product_attention", scaled_dot_product_attention, "AutogradPrivateUse1")


def _autocast_fallthrough() -> torch.library.Library | None:
    """Let operators pass through the AutocastPrivateUse1 key, as C++ backends do: without it,
    every operator under ``torch.autocast("sim")`` fails. Casting rules (per-operator kernels on
    that key) stay free for others to register."""
    if has_backend_fallback("AutocastPrivateUse1"):
        return None
    library = keep_at_exit(torch.library.Library("_", "IMPL"))
    library.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    return library


def _sim_tag(obj: object) -> str | None:
    dev = getattr(obj, "device", None)
    if isinstance(dev, torch.device) and dev.type == state.DEVICE_TYPE:
        return f"{state.DEVICE_TYPE}:{dev.index or 0}"
    return None


def _sim_restore(obj: torch.UntypedStorage | torch.TypedStorage, location: str) -> object:
    """``torch.load`` hook (and ``torch.serialization.default_restore_location``): put a storage
    restored on the host onto the sim device that ``location`` (``'sim'`` or ``'sim:N'``)
    names; a typed storage (the legacy format's) stays typed, as CUDA's hook keeps it."""
    if location != state.DEVICE_TYPE and not location.startswith(state.DEVICE_TYPE + ":"):
        return None
    index = state.to_index(torch.device(location))
    if obj.device == torch.device(state.DEVICE_TYPE, index):
        return obj
    if isinstance(obj, torch.TypedStorage):
        moved = tensors.copy_storage_to_sim(obj._untyped_storage, index)
        return torch.TypedStorage(wrap_storage=moved, dtype=obj.dtype, _internal=True)
    return tensors.copy_storage_to_sim(obj, index)
