"""DeepSpeed's accelerator answered by the selected backend.

DeepSpeed asks one accelerator object (``deepspeed.accelerator.get_accelerator()``) for the
device name, device count and current device, memory statistics, RNG, streams and events,
the collective's name, pinned memory and dtypes. It picks that object itself by importing
vendor plugins (``torch_npu`` → its ``npu`` accelerator, ``torch_mlu`` → ``mlu``, ...), and
otherwise takes CUDA when ``torch.cuda.is_available()`` and else the CPU. Where DeepSpeed has
no accelerator of its own for the backend (``Backend.provides_deepspeed_accelerator``: the cpu
backend with its logical devices, the sim and its profiles), the ``deepspeed_accelerator``
patch installs :func:`make_accelerator`'s object through DeepSpeed's ``set_accelerator`` as
soon as ``deepspeed.accelerator`` has been imported, before DeepSpeed asks for one; undo puts
DeepSpeed's previous choice back. A ``DS_ACCELERATOR`` set by the user is left to DeepSpeed.
"""
from __future__ import annotations

import importlib
import os
from typing import Any, Optional

import torch

from .cuda_api import active_facade
from .cuda_facade import LEGACY_TYPES, _legacy_type
from .devices import Target
from .patches import Patcher, patch_function

#: DeepSpeed's tensor-type properties: each constructs on the current device, as DeepSpeed's
#: CUDA and NPU accelerators' do (a host tensor would miss the device's collective)
_TENSOR_TYPES = ("BFloat16Tensor", "ByteTensor", "DoubleTensor", "FloatTensor", "HalfTensor",
                 "IntTensor", "LongTensor")


@patch_function("deepspeed_accelerator", waits_for="deepspeed.accelerator")
def patch_deepspeed_accelerator(target: Target, patcher: Patcher) -> None:
    """``deepspeed.accelerator.get_accelerator()`` answers for the backend where DeepSpeed has
    no accelerator of its own for it; elsewhere (and under ``DS_ACCELERATOR``) DeepSpeed keeps
    its own choice."""
    if not target.chip.provides_deepspeed_accelerator or "DS_ACCELERATOR" in os.environ:
        return
    real = importlib.import_module("deepspeed.accelerator.real_accelerator")
    accelerator = make_accelerator(target)
    patcher.setattr(real, "ds_accelerator", real.ds_accelerator)
    real.set_accelerator(accelerator)


def make_accelerator(target: Target) -> Any:
    """A DeepSpeed accelerator (a subclass of DeepSpeed's CPU accelerator, whose op builders and
    host-side helpers it keeps) answering every device question for ``target``: devices and
    indices are logical, as ``torch.cuda``'s are under activation; memory, RNG, streams and
    events come from the backend's device module (through the ``torch.cuda`` facade's answers);
    the collective is the backend's. The backends it serves run work inline (the host, the
    sim), so DeepSpeed is told the device is synchronized (host timers, no stream overlap)."""
    from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    facade = active_facade()
    chip = target.chip
    tensor_types = {name: _legacy_type(name, LEGACY_TYPES[name], target) for name in _TENSOR_TYPES}

    class BackendAccelerator(CPU_Accelerator):
        __doc__ = f"DeepSpeed's accelerator for flagos_torchfl backend {chip.name!r}."
        _torch_pins_host_memory = chip.pins_memory

        def __init__(self) -> None:
            super().__init__()
            self._name = target.device_type
            self._communication_backend_name = chip.collective

        # devices
        def device_name(self, device_index=None):
            if device_index is None:
                return target.device_type
            return str(target.translate(int(device_index)))

        def device(self, device_index=None):
            return facade.device_context_class()(device_index)

        def set_device(self, device_index):
            facade.set_device(device_index)

        def current_device(self):
            return facade.current_device()

        def current_device_name(self):
            return str(target.translate(facade.current_device()))

        def device_count(self):
            return facade.device_count()

        def synchronize(self, device_index=None):
            facade.synchronize(device_index)

        def is_available(self):
            return True

        def on_accelerator(self, tensor):
            return tensor.device.type == target.device_type

        # random numbers
        def random(self):
            return torch.random

        def set_rng_state(self, new_state, device_index=None):
            facade.set_rng_state(new_state, "cuda" if device_index is None else device_index)

        def get_rng_state(self, device_index=None):
            return facade.get_rng_state("cuda" if device_index is None else device_index)

        def manual_seed(self, seed):
            facade.manual_seed(seed)

        def manual_seed_all(self, seed):
            facade.manual_seed_all(seed)

        def initial_seed(self):
            return facade.initial_seed()

        def default_generator(self, device_index):
            return facade.default_generators()[device_index]

        # streams and events
        @property
        def Stream(self):
            return facade.stream_class()

        def stream(self, stream):
            return facade.stream(stream)

        def current_stream(self, device_index=None):
            return facade.current_stream(device_index)

        def default_stream(self, device_index=None):
            return facade.default_stream(device_index)

        @property
        def Event(self):
            return facade.event_class()

        # memory
        def empty_cache(self):
            facade.empty_cache()

        def memory_allocated(self, device_index=None):
            return facade.memory_allocated(device_index)

        def max_memory_allocated(self, device_index=None):
            return facade.max_memory_allocated(device_index)

        def reset_max_memory_allocated(self, device_index=None):
            facade.reset_peak_memory_stats(device_index)

        def memory_cached(self, device_index=None):
            return facade.memory_reserved(device_index)

        def max_memory_cached(self, device_index=None):
            return facade.max_memory_reserved(device_index)

        def reset_max_memory_cached(self, device_index=None):
            facade.reset_peak_memory_stats(device_index)

        def memory_stats(self, device_index=None):
            return facade.memory_stats(device_index)

        def reset_peak_memory_stats(self, device_index=None):
            facade.reset_peak_memory_stats(device_index)

        def memory_reserved(self, device_index=None):
            return facade.memory_reserved(device_index)

        def max_memory_reserved(self, device_index=None):
            return facade.max_memory_reserved(device_index)

        def total_memory(self, device_index=None):
            return facade.get_device_properties(device_index).total_memory

        def available_memory(self, device_index=None):
            return facade.mem_get_info(device_index)[0]

        # dtypes: autocast's on the backend where its device module says, else DeepSpeed's
        # answers for the host
        def is_bf16_supported(self):
            amp = _amp_dtypes(target)
            return super().is_bf16_supported() if amp is None else torch.bfloat16 in amp

        def is_fp16_supported(self):
            amp = _amp_dtypes(target)
            return bool(super().is_fp16_supported()) if amp is None else torch.float16 in amp

        def is_fp64_supported(self):
            return chip.supports_float64

        def supported_dtypes(self):
            amp = _amp_dtypes(target)
            return super().supported_dtypes() if amp is None else [torch.float32, *amp]

        # pinned host memory: pinned where the backend pins (the cpu backend has no device)
        def pin_memory(self, tensor, make_copy=True, match_shape=True):
            pin = DeepSpeedAccelerator.pin_memory if chip.pins_memory else CPU_Accelerator.pin_memory
            return pin(self, tensor, make_copy=make_copy, match_shape=match_shape)

        def _torch_pin_memory(self, tensor):
            return tensor.pin_memory() if chip.pins_memory else tensor

        def _torch_empty_pinned(self, tensor, shape):
            if not chip.pins_memory:
                return tensor.new_empty(shape)
            if chip.pins_at_allocation:
                return tensor.new_empty(shape, pin_memory=True)
            return tensor.new_empty(shape).pin_memory()

        def _torch_is_pinned(self, tensor):
            return tensor.is_pinned()

    for name, constructor in tensor_types.items():
        setattr(BackendAccelerator, name, property(lambda self, c=constructor: c))
    return BackendAccelerator()


def _amp_dtypes(target: Target) -> Optional[tuple]:
    """The low-precision dtypes autocast casts to on the backend, from its device module's
    ``get_amp_supported_dtype()`` (None where the module has none: the host)."""
    supported = getattr(target.module, "get_amp_supported_dtype", None)
    return None if supported is None else tuple(supported())
