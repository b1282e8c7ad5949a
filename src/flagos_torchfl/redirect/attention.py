"""Attention entry points that check the device type by name: FlexAttention
(``torch.nn.attention.flex_attention``) admits CUDA, CPU, XPU, HPU and MPS tensors only."""
from __future__ import annotations

import functools

from .devices import Target
from ..patching import Patcher
from .patches import patch_function


@patch_function("flex_attention", waits_for="torch.nn.attention.flex_attention")
def patch_flex_attention(target: Target, patcher: Patcher) -> None:
    """``flex_attention(q, k, v)`` on the backend's device: its device check admits the
    backend's device type as it admits CUDA (PyTorch's eager FlexAttention is a composite of
    ordinary operators, which the chip runs or the routing layer serves; compiled, Inductor's
    code generator for the device). Every other device, and the CPU's refusal of a backward,
    stay as torch checks them."""
    from torch.nn.attention import flex_attention as module

    if not hasattr(module, "_validate_device"):
        return
    own = target.device_type

    def make(original):
        @functools.wraps(original)
        def _validate_device(query, key, value):
            try:
                original(query, key, value)
            except ValueError:  # "only supported on CUDA, CPU, ..." (its other refusals stand)
                if query.device.type != own:
                    raise

        return _validate_device

    patcher.wrap(module, "_validate_device", make)
