"""Quantized tensors on the sim (per-tensor and per-channel affine), as CUDA has them.

A quantized sim tensor is PyTorch's own quantized tensor whose bytes are the sim's memory. The
CPU's quantized kernels serve it: every overload with a kernel on ``QuantizedCPU`` gets a
``QuantizedPrivateUse1`` kernel that calls that CPU kernel on the sim tensors themselves (views,
``q_scale``, ``int_repr`` ...); where the CPU kernel insists on CPU operands (its per-device
routines have no entry for the sim), it runs on host copies and its result is copied back (into
the written operand for an in-place or ``out=`` overload). The overloads are read from the
dispatcher, not listed, and registered at the first call that needs one (:mod:`.host_served`).
Copies between the host, the device and devices copy the raw bytes and keep the quantizer.

The quantized dtypes are CUDA's: its quantized kernels dispatch over ``AT_DISPATCH_QINT_TYPES``
(``aten/src/ATen/native/quantized/cuda/AffineQuantizer.cu``), not the sub-byte types the CPU
has too, so a sub-byte quantized tensor on the sim is refused. PyTorch makes a quantized tensor
with the device's C++ allocator, which only the sim's C++ runtime has: with its Python runtime
quantized tensors on the sim are refused, naming that.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...aten.dispatcher import overload, with_kernel, written_args
from ..runtime import state
from .host_served import LazyKey, moved, sim_device_of

KEY, CPU_KEY = "QuantizedPrivateUse1", "QuantizedCPU"

#: CUDA's quantized dtypes -> the dtype of their raw bytes
DTYPES = {torch.quint8: torch.uint8, torch.qint8: torch.int8, torch.qint32: torch.int32}
_COPY = "aten::_copy_from"


def overloads() -> list[str]:
    """The ``aten`` overloads with a kernel of their own on ``QuantizedCPU``, and ``_copy_from``
    (the sim's byte copy), sorted."""
    return sorted(with_kernel(CPU_KEY) | {_COPY})


def check_dtype(dtype: torch.dtype, name: str) -> None:
    """Refuse quantized ``dtype`` where CUDA's quantized kernels do not take it."""
    if dtype not in DTYPES:
        raise RuntimeError(
            f"{name}: quantized dtype {dtype} is not supported on device type {state.DEVICE_TYPE!r}: "
            f"its quantized kernels take {', '.join(map(str, DTYPES))}, as CUDA's do")


def check_runtime(name: str) -> None:
    """Refuse a quantized sim tensor where the sim runs its Python runtime (no C++ allocator)."""
    if state.cpp_runtime() is None:
        raise RuntimeError(
            f"{name}: quantized tensors on device type {state.DEVICE_TYPE!r} need the sim's C++ runtime "
            "(PyTorch allocates them with the device's C++ allocator); this process runs its Python "
            "runtime (FL_SIM_RUNTIME=python, or the C++ runtime could not be built)")


def _quantized_dtypes(values) -> list[torch.dtype]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_quantized:
            found.append(value.dtype)
        elif isinstance(value, torch.dtype) and str(value).startswith(("torch.qint", "torch.quint")):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(_quantized_dtypes(value))
    return found


def raw(tensor: torch.Tensor) -> torch.Tensor:
    """A dense tensor of quantized ``tensor``'s raw bytes (``uint8`` for ``quint8`` ...), on its
    device, aliasing its memory."""
    return torch.empty(0, dtype=DTYPES[tensor.dtype], device=tensor.device).set_(
        tensor.untyped_storage(), tensor.storage_offset(), tensor.size(), tensor.stride())


def _copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``dst.copy_(src)`` between quantized tensors of which one is on the sim (``copy_`` has
    given ``dst`` ``src``'s quantizer already): their bytes."""
    check_runtime(_COPY)
    check_dtype(src.dtype, _COPY)
    raw(dst).copy_(raw(src), non_blocking=non_blocking)
    return dst


def _kernel(name: str) -> Callable:
    if name == _COPY:
        return _copy_from
    op = overload(name)
    kernel = torch.library.get_kernel(op, CPU_KEY)
    keyset = torch._C.DispatchKeySet(torch._C.DispatchKey.QuantizedCPU)
    names = [a.name for a in op._schema.arguments]
    written = [names.index(name) for name in written_args(op)]

    def run(*args, **kwargs):
        check_runtime(name)
        for dtype in _quantized_dtypes((*args, *kwargs.values())):
            check_dtype(dtype, name)
        try:
            return kernel.call_boxed(keyset, *args, **kwargs)
        except RuntimeError:
            pass  # a CPU kernel that runs on CPU operands only: on host copies
        device = sim_device_of((*args, *kwargs.values()))
        host_args = moved(args, None)
        host_kwargs = {k: moved(v, None) for k, v in kwargs.items()}
        result = op(*host_args, **host_kwargs)
        if not written:
            return moved(result, device)
        for i in written:
            target, host = ((args[i], host_args[i]) if i < len(args)
                            else (kwargs[names[i]], host_kwargs[names[i]]))
            target.copy_(host)
        return args[written[0]] if written[0] < len(args) else kwargs[names[written[0]]]

    run.__name__ = run.__qualname__ = f"sim_quantized_{name[len('aten::'):].replace('.', '_')}"
    return run


def lazy_key(served: Callable[[str, str], bool] | None = None) -> LazyKey:
    """The sim's quantized key, served by ``QuantizedCPU``'s kernels
    (:class:`~.host_served.LazyKey`); ``served(key, name)``, when given, keeps only the overloads
    it accepts."""
    return LazyKey(KEY, lambda: [n for n in overloads() if served is None or served(KEY, n)], _kernel)
