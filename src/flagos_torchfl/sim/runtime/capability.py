"""What the sim's devices can hold: the dtypes ``torch.accelerator.get_device_capability()``
lists as ``supported_dtypes`` ("tensors can be allocated on the accelerator and type conversion
across supported dtypes are supported").

The sim holds a tensor's bytes and copies them with the CPU's ``copy_`` kernel on host views, so
a dtype is supported exactly where that kernel copies it and converts it to and from other
dtypes. The set is found by trying each of the
installed torch's dtypes, not written down: torch 2.13 names 46 dtypes, and the bit-container and
sub-byte integer ones (``bits8``, ``int5``, ``uint3`` ...) have no copy kernel, nor can a raw
buffer be a quantized tensor.
"""
from __future__ import annotations

import functools
import warnings

import torch


def _all_dtypes() -> list[torch.dtype]:
    return sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)


def _copies(dtype: torch.dtype) -> bool:
    """Whether a 4-element tensor of ``dtype`` made from raw bytes (0s and 1s, valid in every
    dtype) copies byte for byte and converts to and from float32 (the trial's warnings are
    silenced: they are not the program's)."""
    with warnings.catch_warnings():  # the trial's own (complex to real casts ...) are nobody's
        warnings.simplefilter("ignore")
        try:
            raw = (torch.arange(4 * dtype.itemsize) % 2).to(torch.uint8)
            source = raw.view(dtype)
            target = torch.empty_like(source)
            target.copy_(source)
            torch.empty(4).copy_(source)
            torch.empty_like(source).copy_(torch.ones(4))
            return torch.equal(target.view(torch.uint8), raw)
        except (RuntimeError, TypeError, NotImplementedError):
            return False


@functools.lru_cache(maxsize=None)
def supported_dtypes() -> frozenset[torch.dtype]:
    """The dtypes a sim device holds and copies (found once per process by trying)."""
    return frozenset(d for d in _all_dtypes() if _copies(d))


def supported_dtype_names() -> list[str]:
    """:func:`supported_dtypes` as the names C++ spells them (``c10::getDtypeNames``: ``"float32"``,
    ``"bfloat16"``), sorted; what the C++ runtime's capability answer is built from."""
    return sorted(str(d).removeprefix("torch.") for d in supported_dtypes())

