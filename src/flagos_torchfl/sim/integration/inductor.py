"""``torch.compile`` on the sim: a dynamo device interface and an Inductor backend for the device
type the sim holds PrivateUse1 as (``sim``, or ``npu`` / ``mlu`` / ``musa`` under a profile).

A sim tensor's data pointer is the host address of its bytes (:mod:`.tensors`), so Inductor's
host C++ code generator serves the sim as it serves the CPU — the way PyTorch's own
``test/inductor/test_extension_backend.py`` drives an out-of-tree device. Fused kernels read and
write the device memory directly; what Inductor leaves to ATen (``extern_kernels.mm``, fallbacks)
runs through the sim's kernels and the routing layer, as in eager mode.

Nothing here is imported at activation: importing dynamo and Inductor costs seconds. Inductor asks
a PrivateUse1 device module for ``Scheduling`` (and the wrapper classes) when it registers its
backends (``init_backend_registration``, on the first compilation); the sim's device module tells
:func:`asked_for` (it listens for absent attributes), which registers the backend and the device
interface itself (with a cache-key pass, which the device-module route cannot carry), and answers
that it has no such attribute, so Inductor keeps that registration. :func:`register_if_loaded`
covers a process that imported dynamo before the sim was installed (and, under activation, the
``compile_device_interface`` patch one that imports it later).

The wrapper differs from the CPU's in two places only: kernels are called as on the CPU (Inductor
otherwise refuses a device type it does not know), and buffers are allocated on the device of the
graph's first sim input, read when the compiled graph runs (Inductor's cache keys a graph without
the device index, so the index cannot be written into the code).
"""
from __future__ import annotations

import functools
import sys
from typing import Any

import torch

from ... import compat
from ..runtime import state

CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")
"""The device-module attributes Inductor reads to register a PrivateUse1 backend."""

_DEVICE_VARIABLE = "fl_sim_device"


def register_if_loaded() -> None:
    """Register the device interface now if dynamo is already imported (else Inductor's first
    request for :data:`CODEGEN_NAMES` does it)."""
    if "torch._dynamo.device_interface" in sys.modules:
        register_device_interface()


def register_device_interface() -> bool:
    """Register the sim's dynamo device interface for its device type; False where this torch
    has no ``register_interface_for_device``."""
    try:
        from torch._dynamo import device_interface
    except ImportError:
        return False
    register = getattr(device_interface, "register_interface_for_device", None)
    if register is None:
        return False
    register(state.DEVICE_TYPE, interface_class())
    return True


def asked_for(name: str) -> None:
    """Told of every attribute torch asks the sim's device module for and it lacks: Inductor's
    request for one of :data:`CODEGEN_NAMES` registers the device interface and the backend."""
    if name in CODEGEN_NAMES:
        register_device_interface()
        register_backend()


@functools.lru_cache(maxsize=None)
def register_backend() -> bool:
    """Register the sim's device interface and its Inductor backend (host C++ kernels, the
    wrapper below, a cache-key pass naming this module's code) for its device type, once; False
    where this torch's Inductor lacks what they build on."""
    try:
        from torch._inductor.codegen import common
        from torch._inductor.codegen.cpp import CppScheduling
        from torch._inductor.codegen.cpp_wrapper_cpu import CppWrapperCpu
        from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides
        from torch._inductor.codegen.wrapper import PythonWrapperCodegen
    except ImportError:
        return False
    register_device_interface()
    _treat_as_cpu()
    if compat.has("inductor_device_op_overrides"):
        common.register_device_op_overrides(state.DEVICE_TYPE, _op_overrides(CpuDeviceOpOverrides)())
    extra: dict[str, Any] = {}
    if compat.has("inductor_backend_options"):
        from torch._inductor.codegen.wrapper_fxir import WrapperFxCodegen

        extra["device_fx_wrapper_codegen"] = WrapperFxCodegen
        cache_key = _cache_key_pass()
        if cache_key is not None:
            extra["device_custom_pass"] = cache_key
    common.register_backend_for_device(state.DEVICE_TYPE, CppScheduling, _wrapper(PythonWrapperCodegen),
                                       CppWrapperCpu, **extra)
    return True


def _treat_as_cpu() -> None:
    """Inductor takes CPU-only decisions (which kernel language, how reductions are split and
    fused) where a node's device type is ``"cpu"``; the sim runs the CPU's code generator, so its
    nodes take them too."""
    from torch._inductor import ir, scheduler, utils

    original_backend = getattr(utils, "get_current_backend", None)
    if original_backend is not None and not hasattr(original_backend, "__flagos_sim_original__"):
        from torch._inductor import config

        def get_current_backend(device_type=None):
            if device_type is None:
                from torch._inductor.virtualized import V

                device_type = V.graph.get_current_device_or_throw().type
            if device_type == state.DEVICE_TYPE:
                return config.cpu_backend
            return original_backend(device_type)

        get_current_backend.__flagos_sim_original__ = original_backend
        for name, module in list(sys.modules.items()):
            if name.startswith("torch._inductor") and getattr(module, "get_current_backend", None) is original_backend:
                module.get_current_backend = get_current_backend

    node = scheduler.BaseSchedulerNode
    if hasattr(node, "is_cpu") and not hasattr(node.is_cpu, "__flagos_sim_original__"):
        original_node = node.is_cpu

        def is_cpu(self) -> bool:
            device = self.get_device()
            return original_node(self) or (device is not None and device.type == state.DEVICE_TYPE)

        is_cpu.__flagos_sim_original__ = original_node
        node.is_cpu = is_cpu
    original_ir = getattr(ir, "is_cpu", None)
    if original_ir is not None and not hasattr(original_ir, "__flagos_sim_original__"):
        def ir_is_cpu(x) -> bool:
            return original_ir(x) or ir.get_device_type(x) == state.DEVICE_TYPE

        ir_is_cpu.__flagos_sim_original__ = original_ir
        ir.is_cpu = ir_is_cpu


def _cache_key_pass() -> Any:
    """A graph pass that changes nothing and whose ``uuid`` (part of Inductor's cache key) is the
    hash of this module's source: code cached by another version of the wrapper is not reused."""
    try:
        from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files
    except ImportError:
        return None

    class SimCodegenVersion(CustomGraphModulePass):
        def __call__(self, gm: torch.fx.GraphModule) -> None:
            return None

        def uuid(self) -> Any:
            return get_hash_for_files((__file__,))

    return SimCodegenVersion()


def _op_overrides(base: type) -> type:
    class SimDeviceOpOverrides(base):
        """The CPU's code snippets, with the sim's device context as device guard."""

        def device_guard(self, device_idx: int) -> str:
            return f"torch.{state.DEVICE_TYPE}.device({device_idx})"

    return SimDeviceOpOverrides


def _wrapper(base: type) -> type:
    class SimWrapperCodegen(base):
        """Inductor's Python wrapper for a sim graph (see the module docstring)."""

        @staticmethod
        def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None):
            if is_subgraph:
                return base.create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures)
            return SimWrapperCodegen()

        def write_args(self, input_names):
            super().write_args(input_names)
            from torch._inductor.virtualized import V

            for name in input_names:
                node = V.graph.graph_inputs.get(name)
                device = node.get_device() if hasattr(node, "get_device") else None
                if device is not None and device.type == state.DEVICE_TYPE:
                    self.prefix.writeline(f"{_DEVICE_VARIABLE} = {name}.device")
                    self._fl_device_known = True
                    break

        def make_allocation(self, name, device, *args, **kwargs):
            line = super().make_allocation(name, device, *args, **kwargs)
            if getattr(self, "_fl_device_known", False) and device.type == state.DEVICE_TYPE:
                line = line.replace(f"device='{device.type}'", f"device={_DEVICE_VARIABLE}")
            return line

        def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True,
                                         **kwargs):
            if not triton and device is not None and device.type == state.DEVICE_TYPE:
                self.writeline(self.wrap_kernel_call(kernel_name, call_args))
                return None
            return super()._generate_kernel_call_helper(kernel_name, call_args, device=device,
                                                        triton=triton, **kwargs)

    return SimWrapperCodegen


@functools.lru_cache(maxsize=None)
def interface_class() -> type:
    """The sim's dynamo ``DeviceInterface`` (imports dynamo)."""
    from torch._dynamo.device_interface import DeviceInterface

    from ..runtime import device as module

    class SimProperties:
        """What Inductor asks of a device's properties."""

        def __init__(self, index: int):
            self.multi_processor_count = 1
            self.total_memory = state.allocator(index).capacity
            self.name = state.DEVICE_NAME

    class SimInterface(DeviceInterface):
        """The sim's runtime as dynamo and Inductor query a device."""

        device = module.device

        class Worker:
            @staticmethod
            def set_device(device: int) -> None:
                module.set_device(device)

            @staticmethod
            def current_device() -> int:
                return module.current_device()

            @staticmethod
            def get_device_properties(device: Any = None) -> SimProperties:
                return SimProperties(state.to_index(device))

        @staticmethod
        def current_device() -> int:
            return module.current_device()

        @staticmethod
        def set_device(device: Any) -> None:
            module.set_device(device)

        @staticmethod
        def maybe_exchange_device(device: int) -> int:
            previous = module.current_device()
            if device >= 0:
                module.set_device(device)
            return previous

        exchange_device = maybe_exchange_device

        @staticmethod
        def device_count() -> int:
            return module.device_count()

        @staticmethod
        def is_available() -> bool:
            return module.is_available()

        @staticmethod
        def synchronize(device: Any = None) -> None:
            module.synchronize(device)

        @staticmethod
        def get_raw_stream(device_idx: int) -> int:
            return 0

        @staticmethod
        def get_compute_capability(device: Any = None) -> str:
            return ""

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False) -> bool:
            return True

        @staticmethod
        def memory_allocated(device: Any = None) -> int:
            return module.memory_allocated(device)

        @staticmethod
        def is_triton_capable(device: Any = None) -> bool:
            return False

        @staticmethod
        def raise_if_triton_unavailable(device: Any = None) -> None:
            raise RuntimeError(f"the {state.DEVICE_TYPE} device compiles with Inductor's C++ "
                               "code generator, not Triton")

    return SimInterface
