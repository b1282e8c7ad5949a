"""Device arguments: how a value that names a CUDA device becomes the selected backend's device.

Only exact CUDA designations are rewritten: the string ``"cuda"`` or ``"cuda:N"``, a
``torch.device`` of type ``cuda``, and — where PyTorch reads an int as a device (``.to(N)``,
``.cuda(N)``, ``device=N``) — a bare int. Anything else passes through as the same object, so a
path such as ``"runs/cuda_ckpt.pt"`` is never touched. Logical ``cuda:i`` is physical device
``selection.devices[i]`` of the backend, as the chip names it (``Backend.torch_device``: on the
CPU backend every logical device is ``cpu``).

Tensors report their real device: ``torch.device`` cannot be faked, so ``x.device.type`` is the
backend's type (``"cpu"``, ``"npu"``, ...). ``Tensor.is_cuda`` is left alone and stays truthful
(False off NVIDIA): PyTorch's own code reads ``is_cuda`` to pick CUDA-only paths (decompositions,
inductor passes, ``__cuda_array_interface__``, distributed, RNN weight flattening), so a lie there
would send host or NPU tensors into CUDA code. The usual branches still work, because what they
do on a "non-CUDA" tensor — ``x.cuda()``, ``x.to("cuda")`` — is redirected.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional, Sequence, Tuple

import torch

from ..errors import DeviceOrdinalError
from ..patching import generator_class
from ..selection_view import SelectionView
from .patches import patch_function


_LOW_PRECISION = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class Target:
    """What the patches redirect to: one chip (a :class:`~flagos_torchfl.backends.Backend`), the
    selected devices and the device module ``torch.cuda`` is answered by (the chip's own unless
    ``module`` is given).

    ``cuda_itself`` is True when the chip's device type is ``cuda`` itself (NVIDIA, ROCm): then
    only logical-to-physical renumbering (``gpu_ids``) can be needed.
    """

    def __init__(
        self,
        chip: Any,
        devices: Sequence[int],
        module: Any = None,
        device_names: Sequence[str] = (),
        device_memory: Sequence[Optional[int]] = (),
        cuda_kernel_packages: Sequence[str] = (),
    ) -> None:
        if not devices:
            raise ValueError(f"backend {chip.name!r} has no devices to redirect to")
        if chip.low_precision_dtype not in _LOW_PRECISION:
            raise ValueError(
                f"low_precision_dtype {chip.low_precision_dtype!r} is not one of {', '.join(_LOW_PRECISION)}"
            )
        self.chip = chip
        self.devices = tuple(devices)
        self.module = chip.device_module() if module is None else module
        self.low_precision_dtype = _LOW_PRECISION[chip.low_precision_dtype]
        self.device_names = tuple(device_names)
        self.device_memory = tuple(device_memory)
        self.cuda_kernel_packages = tuple(cuda_kernel_packages)
        self.cuda_itself = chip.device_type == "cuda"
        self.remaps = self.devices != tuple(range(len(self.devices)))
        self._tls = threading.local()
        self._by_logical = tuple(chip.torch_device(i) for i in self.devices)
        # the backend's own device type without an index, where the backend has it resolved here
        # to the device module's current device (None: it passes unchanged, the chip resolves it)
        resolves = getattr(chip, "resolves_unindexed_device", False) and self._by_logical[0].index is not None
        self._own_type = chip.device_type if resolves else None
        self._module_started, self._module_current = self._follows_module()

    @property
    def chip_name(self) -> str:
        """The chip's name (``sim-ascend`` under the Ascend profile, where the backend asked
        for is ``sim``)."""
        return self.chip.name

    @property
    def device_type(self) -> str:
        return self.chip.device_type

    @property
    def collective(self) -> str:
        return self.chip.collective

    def computes_bfloat16(self) -> bool:
        """Whether the chip computes bfloat16: its device module's ``is_bf16_supported()``
        (torch_npu's on a 910A says False; a sim profile answers as its chip model), else
        whether it declares bfloat16 its low-precision dtype."""
        check = getattr(self.module, "is_bf16_supported", None)
        if callable(check):
            return bool(check())
        return self.low_precision_dtype == torch.bfloat16

    @classmethod
    def from_selection(cls, selection: SelectionView) -> "Target":
        """The target of a :class:`~flagos_torchfl.selection.Selection`."""
        names, memory = [], []
        probe = getattr(selection, "probe", None)
        found = {d.index: d for d in (probe.devices if probe is not None else ())}
        for physical in selection.devices:
            info = found.get(physical)
            names.append(info.name if info else f"{selection.backend} device {physical}")
            memory.append(info.total_memory if info else None)
        return cls(selection.chip, selection.devices, None, names, memory,
                   getattr(selection, "cuda_kernel_packages", ()))

    # ------------------------------------------------------------ logical devices
    @property
    def count(self) -> int:
        return len(self.devices)

    def check_logical(self, index: Any) -> int:
        """``index`` as a valid logical device number, else DeviceOrdinalError naming the count."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.count:
            valid = f"cuda:0..cuda:{self.count - 1}" if self.count > 1 else "cuda:0"
            raise DeviceOrdinalError(
                f"cuda:{index} does not exist: backend {self.chip_name!r} has {self.count} "
                f"device(s) ({valid}); {self._more_devices()}"
            )
        return index

    def _more_devices(self) -> str:
        """How a user gets other devices on this chip."""
        if self.chip.devices_env:
            return (f"it presents as many logical devices as {self.chip.devices_env} says: set "
                    f"{self.chip.devices_env}=N, or start with `python -m flagos_torchfl run --devices N`")
        return "choose devices with gpu_ids / FL_GPU_IDS"

    def physical(self, logical: int) -> int:
        """The backend's device index behind logical ``cuda:logical``."""
        return self.devices[self.check_logical(logical)]

    def device_for(self, logical: int) -> torch.device:
        """The target ``torch.device`` for logical ``cuda:logical``."""
        return self._by_logical[self.check_logical(logical)]

    def _follows_module(self) -> Tuple[Optional[Callable], Optional[Callable]]:
        """Where the devices are not renumbered and the device module keeps a current device,
        the module's ``(is_initialized, current_device)``: then a device made current through
        the chip's own API (``torch.npu.set_device``, ``torch.accelerator.set_device_index``, the
        ``set_device`` that ``DeviceMesh`` calls on ``torch.<device type>``) is current for
        ``torch.cuda`` too. Otherwise ``(None, None)``."""
        if self.cuda_itself or self.remaps or self._by_logical[0].index is None:
            return None, None
        started = getattr(self.module, "is_initialized", None)
        current = getattr(self.module, "current_device", None)
        return (started, current) if callable(started) and callable(current) else (None, None)

    @property
    def current(self) -> int:
        """The logical current device of this thread (``torch.cuda.current_device()``): the
        device module's once its runtime has started, where :meth:`_follows_module` says it
        keeps one (before, nothing can have set it: setting a device starts the runtime, and
        asking the module would start it too on a vendor's), else the last one set here."""
        if self._module_started is not None and self._module_started():
            index = self._module_current()
            if index.__class__ is int and 0 <= index < len(self.devices):
                return index
        return getattr(self._tls, "current", 0)

    @current.setter
    def current(self, logical: int) -> None:
        self._tls.current = self.check_logical(logical)

    # ------------------------------------------------------------ translation
    def translate(self, value: Any) -> Any:
        """``value`` rewritten when it names a CUDA device exactly, else ``value`` itself.

        Accepts ``"cuda"``, ``"cuda:N"``, ``torch.device("cuda"[, N])`` and bare ints (callers
        pass ints only where PyTorch reads them as devices). ``"cuda"`` without an index means
        the current device, as in CUDA; the backend's own device type without one (``"sim"``, as
        DeepSpeed's ``tensor.to(accelerator.device_name())`` names it) means the device module's
        current device where the backend says it ``resolves_unindexed_device`` (the sim, whose
        device guard cannot), and passes unchanged elsewhere. Out-of-range
        indices raise DeviceOrdinalError.
        """
        cls = value.__class__
        if cls is str:
            if value == "cuda":
                return self._unindexed()
            if value == self._own_type:
                return self._current_own()
            if value.startswith("cuda:"):
                rest = value[5:]
                if rest.isdigit() and rest.isascii():
                    return self.device_for(int(rest))
            return value
        if cls is torch.device:
            if value.type != "cuda":
                return self._current_own() if value.type == self._own_type and value.index is None else value
            return self._unindexed() if value.index is None else self.device_for(value.index)
        if cls is int:
            return self.device_for(value)
        return value

    def translate_named(self, value: Any) -> Any:
        """Like :meth:`translate`, but ints pass through (they are not devices here)."""
        return value if value.__class__ is int else self.translate(value)

    def translate_type(self, device_type: Any) -> Any:
        """``"cuda"`` (a device *type*, as autocast and GradScaler take it) -> the backend's type."""
        if device_type == "cuda":
            return self.device_type
        if isinstance(device_type, torch.device) and device_type.type == "cuda":
            return self.device_type
        return device_type

    def logical_index(self, device: Any = None) -> int:
        """The logical index a ``torch.cuda.*`` device argument means (None: the current one)."""
        if device is None:
            return self.current
        if isinstance(device, str):
            if device == "cuda":
                return self.current
            if device.startswith("cuda:") and device[5:].isdigit():
                return self.check_logical(int(device[5:]))
            device = torch.device(device)
        if isinstance(device, torch.device):
            if device.type not in ("cuda", self.device_type):
                raise ValueError(f"expected a cuda device, got {device}")
            if device.index is None:
                return self.current
            if device.type == "cuda":
                return self.check_logical(device.index)
            return self._logical_of_physical(device.index)
        return self.check_logical(device)

    def _logical_of_physical(self, physical: int) -> int:
        if physical in self.devices:
            return self.devices.index(physical)
        raise DeviceOrdinalError(
            f"{self.device_type}:{physical} is not among the selected devices {list(self.devices)} "
            f"of backend {self.chip_name!r}"
        )

    def _current_own(self) -> torch.device:
        # the backend's own device type without an index: the device module's current device,
        # as the chip's C++ device guard would resolve it
        return torch.device(self._own_type, self.module.current_device())

    def _unindexed(self) -> torch.device:
        # "cuda" means the current device; it is named with its index, because a device type
        # without one is resolved by the chip's C++ device guard, which a Python-registered
        # PrivateUse1 backend (the sim) cannot make follow set_device.
        return self._by_logical[self.current]


@patch_function("device_context", on_cuda=True)
def patch_device_context(target: Target, patcher) -> None:
    """``with torch.device("cuda"):`` and ``torch.set_default_device("cuda")``.

    Both build ``torch.utils._device.DeviceContext`` (the C ``torch.device.__enter__`` looks the
    class up by name), so translating its device at construction covers both; the context then
    hands the target device to the original factory functions.
    """
    from torch.utils._device import DeviceContext

    original = DeviceContext.__init__

    def __init__(self, device):
        original(self, target.translate(device))

    patcher.setattr(DeviceContext, "__init__", __init__)


@patch_function("generator", on_cuda=True)
def patch_generator(target: Target, patcher) -> None:
    """``torch.Generator("cuda")`` / ``torch.Generator(device="cuda:N")``: a generator of the
    target device (a real ``torch._C.Generator``; isinstance checks keep working)."""
    original = torch.Generator
    patcher.setattr(torch, "Generator",
                    generator_class(original, lambda device="cpu": original(device=target.translate(device))))
