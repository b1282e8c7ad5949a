"""``torch.nn.DataParallel`` on every backend.

DataParallel takes its device type from ``torch._utils._get_available_device_type()`` (the
``available_device_type`` patch answers the real accelerator: the chip's own type where it has
one), its device ids from the program as CUDA numbers, and moves tensors with the device-comm
primitives of ``torch.nn.parallel.comm``, which call ``torch._C``'s CUDA functions (absent from a
CPU build of torch; on a CUDA build they reach the CUDA runtime).

Two patches:

* ``data_parallel``: on a chip whose devices are numbered (the sim, a profile's ``npu``),
  ``DataParallel(module, device_ids=, output_device=)`` and ``data_parallel(...)`` take the
  program's logical CUDA numbers (ints, ``"cuda:N"``, ``torch.device("cuda", N)``) as the chip's
  physical indices; without ``device_ids``, every selected device. Scatter, replication,
  ``parallel_apply`` and gather then run as torch runs them on CUDA. Where every logical device
  is the host (the cpu backend), ``DataParallel.forward`` and ``data_parallel`` run the module
  itself on the whole batch, as DataParallel does with one device: the single-device result
  (forward values, gradients, BatchNorm statistics of the whole batch; a scalar output stays a
  scalar), since there is no second device to split the batch over.
* ``data_parallel_comm``: ``broadcast``, ``broadcast_coalesced``, ``reduce_add``, ``scatter``
  and ``gather`` of ``torch.nn.parallel.comm`` (and ``torch.cuda.comm``, which takes them by
  name) in Python with torch's semantics, for the chip's devices; ``reduce_add_coalesced`` is
  torch's own, which calls the module's ``reduce_add``. A call given a real CUDA tensor goes to
  torch's own function. Applied where the chip's devices are numbered: on the cpu backend the
  primitives stay as torch defines them for the host.
"""
from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Callable, List, Optional, Sequence

import torch

from .devices import Target
from ..patching import Patcher, with_edited_arguments
from .patches import patch_function


def _numbers_devices(target: Target) -> bool:
    """Whether the chip's logical devices are devices of their own (False: all the host)."""
    return target.device_for(0).index is not None


def _physical_id(target: Target, value: Any) -> Any:
    """A DataParallel device id or output device as the chip's physical index: a logical CUDA
    number (int >= 0, ``"cuda:N"``, ``torch.device("cuda", N)``) is translated; -1, ``"cpu"`` and
    the chip's own devices pass as they are."""
    if value.__class__ is int:
        return value if value < 0 else target.physical(value)
    translated = target.translate(value)
    if isinstance(translated, torch.device) and translated.type == target.device_type:
        return translated.index
    return translated


@patch_function("data_parallel", waits_for="torch.nn.parallel.data_parallel")
def patch_data_parallel(target: Target, patcher: Patcher) -> None:
    """``DataParallel`` and ``data_parallel`` on the chip's devices (see the module docstring)."""
    from torch.nn import parallel

    module = sys.modules["torch.nn.parallel.data_parallel"]  # the package's name is the function

    if _numbers_devices(target):
        def edit(values: dict) -> None:
            ids = values.get("device_ids")
            values["device_ids"] = (list(target.devices) if ids is None
                                    else [_physical_id(target, d) for d in ids])
            if values.get("output_device") is not None:
                values["output_device"] = _physical_id(target, values["output_device"])

        patcher.wrap_arguments(module.DataParallel, "__init__", edit)
        functional = with_edited_arguments(module.data_parallel, edit)
    else:
        patcher.wrap(module.DataParallel, "forward", _forward_on_host)
        functional = _data_parallel_on_host(module.data_parallel)
    patcher.replace_in((module, parallel), "data_parallel", module.data_parallel, functional)


def _forward_on_host(original: Callable) -> Callable:
    @functools.wraps(original)
    def forward(self, *inputs: Any, **kwargs: Any) -> Any:
        if not self.device_ids:
            return original(self, *inputs, **kwargs)
        with torch.autograd.profiler.record_function("DataParallel.forward"):
            return self.module(*inputs, **kwargs)

    return forward


def _data_parallel_on_host(original: Callable) -> Callable:
    @functools.wraps(original)
    def data_parallel(module: torch.nn.Module, inputs: Any, device_ids: Any = None, output_device: Any = None,
                      dim: int = 0, module_kwargs: Any = None) -> Any:
        if not isinstance(inputs, tuple):
            inputs = (inputs,) if inputs is not None else ()
        return module(*inputs, **(module_kwargs or {}))

    return data_parallel


#: the primitives replaced, and the modules that hold them (``torch.cuda.comm`` by name)
_COMM_NAMES = ("broadcast", "broadcast_coalesced", "reduce_add", "scatter", "gather")
_COMM_OWNERS = ("torch.nn.parallel.comm", "torch.cuda.comm")


@patch_function("data_parallel_comm", waits_for="torch.nn.parallel.comm")
def patch_data_parallel_comm(target: Target, patcher: Patcher) -> None:
    """The device-comm primitives of ``torch.nn.parallel.comm`` on the chip's devices."""
    if not _numbers_devices(target):
        return
    from torch.nn.parallel import comm

    chip = _ChipComm(target)
    owners = [sys.modules.get(name) for name in _COMM_OWNERS]
    for name in _COMM_NAMES:
        original = getattr(comm, name)
        patcher.replace_in(owners, name, original, _unless_cuda(original, getattr(chip, name)))


def _unless_cuda(original: Callable, chip: Callable) -> Callable:
    """``chip``, or ``original`` for a call that passes a real CUDA tensor."""
    @functools.wraps(original)
    def primitive(*args: Any, **kwargs: Any) -> Any:
        if any(t.is_cuda for t in _tensors((args, kwargs))):
            return original(*args, **kwargs)
        return chip(*args, **kwargs)

    return primitive


def _tensors(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


class _ChipComm:
    """torch's device-comm primitives with the chip's devices in CUDA's place: ints are the
    chip's device indices (DataParallel passes them so), CUDA-named devices are translated.
    Each keeps torch's signature, checks, error messages and results."""

    def __init__(self, target: Target) -> None:
        self.target = target

    def _index(self, device: Any, optional: bool = False, allow_cpu: bool = False) -> int:
        from torch._utils import _get_device_index

        if isinstance(device, (str, torch.device)):
            device = self.target.translate(device)
        return _get_device_index(device, optional, allow_cpu)

    def _device(self, index: int) -> torch.device:
        return torch.device("cpu") if index == -1 else self.target.chip.torch_device(index)

    def _check_on_chip(self, tensors: Sequence[torch.Tensor], what: str) -> None:
        own = self.target.device_type
        for i, t in enumerate(tensors):
            if t.device.type != own:
                raise RuntimeError(f"Expected all {what} tensors to be {own} tensors, but {what} tensor "
                                   f"at index {i} was on {t.device}")

    def broadcast(self, tensor: torch.Tensor, devices: Any = None, *, out: Any = None) -> List[torch.Tensor]:
        """Copies of ``tensor`` on ``devices`` (the tensor itself on its own device, which must
        come first), or copied into ``out``."""
        from torch._utils import _handle_complex

        tensor = _handle_complex(tensor)
        if not ((devices is None) ^ (out is None)):
            raise RuntimeError(
                f"Exactly one of 'devices' and 'out' must be specified, but got devices={devices} and out={out}")
        if devices is None:
            self._check_on_chip(out, "output")
            for i, o in enumerate(out):
                if o.shape != tensor.shape:
                    raise RuntimeError(f"Expected all output tensors to have same shape as the source tensor "
                                       f"{tuple(tensor.shape)}, but output tensor at index {i} has shape "
                                       f"{tuple(o.shape)}")
            for o in out:
                o.copy_(tensor, non_blocking=True)
            return list(out)
        indices = [self._index(d) for d in devices]
        own = tensor.get_device()
        if own >= 0 and indices and indices[0] != own:
            raise RuntimeError("device of broadcasted tensor must appear as the first on devices list")
        return [tensor if i == own else self._copy(tensor, i) for i in indices]

    def _copy(self, tensor: torch.Tensor, index: int) -> torch.Tensor:
        """A new tensor on device ``index`` with ``tensor``'s values, without autograd history."""
        if tensor.is_sparse:
            return tensor.detach().to(self._device(index), copy=True)
        return torch.empty(tensor.shape, dtype=tensor.dtype, device=self._device(index)).copy_(tensor.detach())

    def broadcast_coalesced(self, tensors: Sequence[torch.Tensor], devices: Any,
                            buffer_size: int = 10485760) -> List[List[torch.Tensor]]:
        """``tensors`` (all on ``devices[0]``) on each of ``devices``: the tensors themselves on
        the first, new tensors without autograd history on the others. Copied tensor by tensor:
        ``buffer_size`` bounds torch's coalescing of small tensors, which changes no value."""
        from torch._utils import _handle_complex

        indices = [self._index(d) for d in devices]
        tensors = [_handle_complex(t) for t in tensors]
        if any(t.get_device() != indices[0] for t in tensors):
            raise RuntimeError(f"All tensors must be on devices[0]: {indices[0]}")
        return [list(tensors)] + [[self._copy(t, i) for t in tensors] for i in indices[1:]]

    def reduce_add(self, inputs: Sequence[torch.Tensor], destination: Any = None) -> torch.Tensor:
        """The elementwise sum of ``inputs`` on ``destination`` (default: the current device),
        which must hold one of them."""
        destination = self._index(destination, optional=True)
        input_size = inputs[0].size()
        root_index = None
        for i, inp in enumerate(inputs):
            if inp.get_device() < 0:  # a host tensor
                raise AssertionError(f"reduce_add expects all inputs to be on GPUs, but input {i} is on CPU")
            if inp.get_device() == destination:
                root_index = i
            if inp.size() != input_size:
                got = "x".join(str(x) for x in inp.size())
                expected = "x".join(str(x) for x in input_size)
                raise ValueError(f"input {i} has invalid size: got {got}, but expected {expected}")
        if root_index is None:
            raise RuntimeError("reduce_add expects destination to be on the same GPU with one of the tensors")
        if len(inputs) == 1:
            return inputs[0]
        destination_device = inputs[root_index].device
        nonroot = [t for i, t in enumerate(inputs) if i != root_index]
        result = inputs[root_index] + nonroot[0].to(device=destination_device, non_blocking=True)
        for other in nonroot[1:]:
            result.add_(other.to(device=destination_device, non_blocking=True))
        return result

    def scatter(self, tensor: torch.Tensor, devices: Any = None, chunk_sizes: Any = None, dim: int = 0,
                streams: Any = None, *, out: Any = None) -> tuple:
        """``tensor`` split along ``dim`` (into ``chunk_sizes``, or equal chunks), one chunk per
        device (a chunk already on its device stays a view), or copied into ``out``."""
        from torch._utils import _handle_complex

        tensor = _handle_complex(tensor)
        if out is not None:
            if devices is not None:
                raise RuntimeError(
                    f"'devices' must not be specified when 'out' is specified, but got devices={devices}")
            if chunk_sizes is not None:
                raise RuntimeError(
                    f"'chunk_sizes' must not be specified when 'out' is specified, but got chunk_sizes={chunk_sizes}")
            return tuple(self._scatter_out(tensor, list(out), dim, streams))
        indices = [self._index(d) for d in devices]
        if not indices:
            raise RuntimeError("Expected at least one device to scatter to")
        if chunk_sizes is not None and len(chunk_sizes) != len(indices):
            raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got "
                               f"len(devices) = {len(indices)} and len(chunk_sizes) = {len(chunk_sizes)}")
        chunks = (tensor.split([int(s) for s in chunk_sizes], dim) if chunk_sizes is not None
                  else tensor.chunk(len(indices), dim))
        own, placed = tensor.get_device(), []
        for i, (chunk, index) in enumerate(zip(chunks, indices)):
            if index != own:
                device = self._device(index)
                chunk = self._on_stream(streams, i, index, lambda c=chunk, d=device: c.to(d, non_blocking=True))
            placed.append(chunk)
        return tuple(placed)

    def _scatter_out(self, tensor: torch.Tensor, out: List[torch.Tensor], dim: int, streams: Any) -> list:
        if not out:
            raise RuntimeError("Expected at least one output tensor to scatter to")
        self._check_on_chip(out, "output")
        dim = dim % tensor.dim() if tensor.dim() else 0
        expected = list(tensor.shape)
        for i, o in enumerate(out):
            expected[dim] = o.size(dim)
            if list(o.shape) != expected:
                raise RuntimeError(f"Output tensor at index {i} has incorrect shape: {tuple(o.shape)}. "
                                   f"Expected same shape except for scatter dim {dim} as: {tuple(tensor.shape)}.")
        total = sum(o.size(dim) for o in out)
        if total != tensor.size(dim):
            raise RuntimeError(f"Total size for output tensors along scatter dim {dim} does not match the "
                               f"source tensor size at dim {dim}. Expected {tensor.size(dim)}, but got total size "
                               f"{total}.")
        chunks = tensor.split([o.size(dim) for o in out], dim)
        for i, (o, chunk) in enumerate(zip(out, chunks)):
            self._on_stream(streams, i, o.get_device(), lambda o=o, c=chunk: o.copy_(c, non_blocking=True))
        return out

    @staticmethod
    def _on_stream(streams: Any, i: int, index: int, copy: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``copy()`` on ``streams[i]`` when one is given for chunk ``i`` (on its device)."""
        stream = streams[i] if streams is not None and i < len(streams) else None
        if stream is None:
            return copy()
        if stream.device_index != index:
            raise RuntimeError(f"Expected the device associated with the stream at index {i} (was "
                               f"{stream.device_index}) to match the device supplied at that index (expected {index})")
        with stream:
            return copy()

    def gather(self, tensors: Sequence[torch.Tensor], dim: int = 0, destination: Any = None, *,
               out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``tensors`` concatenated along ``dim`` on ``destination`` (a device, ``"cpu"`` or -1;
        default: the current device), or into ``out``."""
        from torch._utils import _handle_complex

        tensors = [_handle_complex(t) for t in tensors]
        if out is not None:
            if destination is not None:
                raise RuntimeError(
                    f"'destination' must not be specified when 'out' is specified, but got destination={destination}")
            sizes = self._gather_sizes(tensors, dim)
            if list(out.shape) != sizes:
                raise RuntimeError(f"Expected out tensor to have shape {tuple(sizes)}, but got {tuple(out.shape)}")
            return self._gather_into(tensors, out, dim)
        if destination == -1:
            warnings.warn("Using -1 to represent CPU tensor is deprecated. Please use a "
                          'device object or string instead, e.g., "cpu".', FutureWarning, stacklevel=3)
        index = self._index(destination, optional=True, allow_cpu=True)
        sizes = self._gather_sizes(tensors, dim)
        result = torch.empty(sizes, dtype=tensors[0].dtype, device=self._device(index))
        return self._gather_into(tensors, result, dim)

    def _gather_sizes(self, tensors: Sequence[torch.Tensor], dim: int) -> List[int]:
        if not tensors:
            raise RuntimeError("Expected at least one tensor to gather from")
        self._check_on_chip(tensors, "input")
        first = tensors[0]
        dim = dim % first.dim() if first.dim() else 0
        expected = list(first.shape)
        total = 0
        for i, t in enumerate(tensors):
            if t.dim() != len(expected):
                raise RuntimeError(f"Expected all input tensors to have the same number of dimensions, but tensor "
                                   f"at index {i}has {t.dim()} dimensions, (expected {len(expected)})")
            expected[dim] = t.size(dim)
            if list(t.shape) != expected:
                raise RuntimeError(
                    f"Input tensor at index {i} has invalid shape {list(t.shape)}, but expected {expected}")
            total += t.size(dim)
        expected[dim] = total
        return expected

    @staticmethod
    def _gather_into(tensors: Sequence[torch.Tensor], result: torch.Tensor, dim: int) -> torch.Tensor:
        for chunk, t in zip(result.split([t.size(dim) for t in tensors], dim), tensors):
            chunk.copy_(t, non_blocking=True)
        return result
