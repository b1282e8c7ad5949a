"""The DeepSpeed accelerator of a backend DeepSpeed has none of its own for (the cpu backend with
its logical devices, the sim and its profiles), installed by the ``deepspeed_accelerator`` patch
(:mod:`.deepspeed_accelerator`). This module imports DeepSpeed: it is imported only once
DeepSpeed's accelerator package has been.

A subclass of DeepSpeed's CPU accelerator, whose op builders and host-side helpers it keeps.
Devices and indices are logical, as ``torch.cuda``'s are under activation; memory, RNG, streams
and events are the ``torch.cuda`` facade's answers (:data:`FACADE_ANSWERS`), so the backend's
device module gives them; the collective is the backend's. The backends it serves run work
inline (the host, the sim), so DeepSpeed is told the device is synchronized (host timers, no
stream overlap).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from deepspeed.accelerator.abstract_accelerator import DeepSpeedAccelerator
from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

from .cuda_facade import LEGACY_TYPES, CudaFacade, _legacy_type
from .devices import Target

#: DeepSpeed's tensor-type properties: each constructs on the current device, as DeepSpeed's
#: CUDA and NPU accelerators' do (a host tensor would miss the device's collective)
TENSOR_TYPES = ("BFloat16Tensor", "ByteTensor", "DoubleTensor", "FloatTensor", "HalfTensor",
                "IntTensor", "LongTensor")
#: DeepSpeed's accelerator method -> the facade's method that answers it, arguments unchanged
FACADE_ANSWERS = {
    "set_device": "set_device", "current_device": "current_device", "device_count": "device_count",
    "synchronize": "synchronize", "manual_seed": "manual_seed", "manual_seed_all": "manual_seed_all",
    "initial_seed": "initial_seed", "stream": "stream", "current_stream": "current_stream",
    "default_stream": "default_stream", "empty_cache": "empty_cache",
    "memory_allocated": "memory_allocated", "max_memory_allocated": "max_memory_allocated",
    "reset_max_memory_allocated": "reset_peak_memory_stats", "memory_cached": "memory_reserved",
    "max_memory_cached": "max_memory_reserved", "reset_max_memory_cached": "reset_peak_memory_stats",
    "memory_stats": "memory_stats", "reset_peak_memory_stats": "reset_peak_memory_stats",
    "memory_reserved": "memory_reserved", "max_memory_reserved": "max_memory_reserved",
}


class BackendAccelerator(CPU_Accelerator):
    """DeepSpeed's accelerator for one flagos_torchfl backend (``target``), answered through the
    ``torch.cuda`` facade ``facade``."""

    def __init__(self, target: Target, facade: CudaFacade) -> None:
        super().__init__()
        self.target, self.facade, self.chip = target, facade, target.chip
        self._name = target.device_type
        self._communication_backend_name = target.chip.collective
        self._torch_pins_host_memory = target.chip.pins_memory
        self._tensor_types = {name: _legacy_type(name, LEGACY_TYPES[name], target) for name in TENSOR_TYPES}

    def __repr__(self) -> str:
        return f"<DeepSpeed accelerator of flagos_torchfl backend {self.chip.name!r}>"

    # devices
    def device_name(self, device_index=None):
        if device_index is None:
            return self.target.device_type
        return str(self.target.translate(int(device_index)))

    def device(self, device_index=None):
        return self.facade.device_context_class()(device_index)

    def current_device_name(self):
        return str(self.target.translate(self.facade.current_device()))

    def is_available(self):
        return True

    def on_accelerator(self, tensor):
        return tensor.device.type == self.target.device_type

    # random numbers
    def random(self):
        return torch.random

    def set_rng_state(self, new_state, device_index=None):
        self.facade.set_rng_state(new_state, "cuda" if device_index is None else device_index)

    def get_rng_state(self, device_index=None):
        return self.facade.get_rng_state("cuda" if device_index is None else device_index)

    def default_generator(self, device_index):
        return self.facade.default_generators()[device_index]

    # streams and events
    @property
    def Stream(self):
        return self.facade.stream_class()

    @property
    def Event(self):
        return self.facade.event_class()

    # memory
    def total_memory(self, device_index=None):
        return self.facade.get_device_properties(device_index).total_memory

    def available_memory(self, device_index=None):
        return self.facade.mem_get_info(device_index)[0]

    # dtypes: autocast's on the backend where its device module says, else DeepSpeed's answers
    # for the host
    def is_bf16_supported(self):
        amp = self._amp_dtypes()
        return super().is_bf16_supported() if amp is None else torch.bfloat16 in amp

    def is_fp16_supported(self):
        amp = self._amp_dtypes()
        return bool(super().is_fp16_supported()) if amp is None else torch.float16 in amp

    def is_fp64_supported(self):
        return self.chip.supports_float64

    def supported_dtypes(self):
        amp = self._amp_dtypes()
        return super().supported_dtypes() if amp is None else [torch.float32, *amp]

    def _amp_dtypes(self) -> Optional[tuple]:
        """The low-precision dtypes autocast casts to on the backend, from its device module's
        ``get_amp_supported_dtype()`` (None where the module has none: the host)."""
        supported = getattr(self.target.module, "get_amp_supported_dtype", None)
        return None if supported is None else tuple(supported())

    # pinned host memory: pinned where the backend pins (the cpu backend has no device)
    def pin_memory(self, tensor, make_copy=True, match_shape=True):
        pin = DeepSpeedAccelerator.pin_memory if self.chip.pins_memory else CPU_Accelerator.pin_memory
        return pin(self, tensor, make_copy=make_copy, match_shape=match_shape)

    def _torch_pin_memory(self, tensor):
        return tensor.pin_memory() if self.chip.pins_memory else tensor

    def _torch_empty_pinned(self, tensor, shape):
        if not self.chip.pins_memory:
            return tensor.new_empty(shape)
        if self.chip.pins_at_allocation:
            return tensor.new_empty(shape, pin_memory=True)
        return tensor.new_empty(shape).pin_memory()

    def _torch_is_pinned(self, tensor):
        return tensor.is_pinned()


def _facade_answer(name: str, facade_name: str) -> Callable:
    def answer(self: BackendAccelerator, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.facade, facade_name)(*args, **kwargs)

    answer.__name__ = answer.__qualname__ = name
    answer.__doc__ = f"The ``torch.cuda`` facade's ``{facade_name}``."
    return answer


def _tensor_type(name: str) -> property:
    return property(lambda self: self._tensor_types[name], doc=f"``{name}`` on the current device.")


for _name, _facade_name in FACADE_ANSWERS.items():
    setattr(BackendAccelerator, _name, _facade_answer(_name, _facade_name))
for _name in TENSOR_TYPES:
    setattr(BackendAccelerator, _name, _tensor_type(_name))
