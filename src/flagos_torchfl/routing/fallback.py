"""The CPU fallback route: run an operator on host copies of its arguments and bring the
results back, keeping PyTorch's semantics:

* in-place and ``out=`` arguments are written back into the caller's device tensors (resized
  first when the host kernel resized them, given the kernel's layout when it chose one) and
  those very tensors are returned;
* an operator returning a view of an input returns a view of the *device* input with the
  geometry the operator gives (computed on the meta device, so no bytes move);
* fresh results are copied to the device of the first device argument (or ``device=``), with
  the kernel's layout: a result that views part of a larger buffer (the solution of
  ``linalg_lstsq``, a narrow of a column-major buffer, as every device's kernel returns it)
  arrives as the same view of a copy of that buffer, so the operators after it see the strides
  they would on the device, and round as there.

Operators the CPU has no kernel for but has an equivalent of (``convolution_overrideable`` is
``convolution`` on the CPU) run as that equivalent.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from ..aten import dispatcher
from . import schema

aten = torch.ops.aten


class RouteUnavailable(Exception):
    """A route cannot serve this call; the message says why."""


_state = threading.local()


def in_transfer() -> bool:
    """True while this thread is copying operands to or from the host for a fallback."""
    return getattr(_state, "transfer", False)


def runs_on_host(op) -> bool:
    """True while this thread runs ``op``'s host kernel for a fallback: a call of ``op`` that
    reaches the router then is the fallback re-entering itself (the routed key is the host's)."""
    return op in getattr(_state, "host_ops", ())


def _conv_backward_args(bound: Dict[str, Any]) -> Dict[str, Any]:
    weight = bound["weight"]
    out_channels = weight.size(1) * bound["groups"] if bound["transposed"] else weight.size(0)
    return {**bound, "bias_sizes": [out_channels]}


#: operator -> (host operator, argument rewrite) for operators the CPU only knows by another name
HOST_EQUIVALENTS: Dict[str, Tuple[Any, Callable[[Dict[str, Any]], Dict[str, Any]]]] = {
    "aten::convolution_overrideable": (aten.convolution.default, dict),
    "aten::convolution_overrideable.out": (aten.convolution.out, dict),
    "aten::convolution_backward_overrideable": (aten.convolution_backward.default, _conv_backward_args),
    "aten::convolution_backward_overrideable.out": (aten.convolution_backward.out, _conv_backward_args),
}


def host_operator(op) -> Tuple[Any, Optional[Callable]]:
    """(the operator to run on the CPU, argument rewrite or None)."""
    entry = HOST_EQUIVALENTS.get(schema.qualified_name(op))
    return entry if entry is not None else (op, None)


def can_run(op) -> Optional[str]:
    """None when the CPU can run ``op`` (or its equivalent), else the reason it cannot."""
    host_op, _ = host_operator(op)
    name = schema.qualified_name(host_op)
    if not dispatcher.has_computed_kernel(name, "CPU"):
        return f"the CPU has no kernel for {name}"
    if name.endswith("_overrideable") or "_overrideable." in name:
        return f"{name} is a stub for out-of-tree backends"
    return None


class _Mover:
    """Copies device tensors to the host once each (aliasing preserved) and counts the bytes."""

    def __init__(self, device_type: str):
        self.device_type = device_type
        self.bytes = 0
        self.device: Optional[torch.device] = None
        self._copies: Dict[int, torch.Tensor] = {}
        #: the strides each host copy had before the kernel ran, by the copy's id
        self._strides: Dict[int, Tuple[int, ...]] = {}

    def is_device_tensor(self, value: Any) -> bool:
        return isinstance(value, torch.Tensor) and value.device.type == self.device_type

    def to_host(self, value: Any) -> Any:
        if self.is_device_tensor(value):
            if self.device is None:
                self.device = value.device
            found = self._copies.get(id(value))
            if found is None:
                found = value.to("cpu")
                self.bytes += value.numel() * value.element_size()
                self._copies[id(value)] = found
                self._strides[id(found)] = found.stride()
            return found
        if isinstance(value, torch.device) and value.type == self.device_type:
            if self.device is None:
                self.device = value
            return torch.device("cpu")
        if isinstance(value, (list, tuple)) and value and any(
            isinstance(v, (torch.Tensor, torch.device)) for v in value
        ):
            return type(value)(self.to_host(v) for v in value)
        return value

    def to_device(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if _copy_keeps_layout(value):
                self.bytes += value.numel() * value.element_size()
                return value.to(self.device)
            self.bytes += value.untyped_storage().nbytes()
            return _with_its_buffer(value, self.device)
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_device(v) for v in value)
        return value

    def write_back(self, target: Any, host: Any) -> None:
        if isinstance(target, torch.Tensor):
            if target.shape != host.shape:
                target.resize_(host.shape)
            if target.stride() != host.stride() and self._strides.get(id(host)) != host.stride():
                # the kernel gave the output a layout of its own (``linalg_lstsq``'s solution, a
                # narrow of a column-major buffer): the device tensor takes it, as from a device kernel
                moved = self.to_device(host)
                target.set_(moved.untyped_storage(), moved.storage_offset(), moved.shape, moved.stride())
                return
            target.copy_(host)
            self.bytes += host.numel() * host.element_size()
        elif isinstance(target, (list, tuple)):
            for t, h in zip(target, host):
                self.write_back(t, h)


def _copy_keeps_layout(t: torch.Tensor) -> bool:
    """Whether ``t.to(device)`` gives ``t``'s strides: ``t`` is contiguous or dense in some
    order (what ``preserve_format`` keeps), or not a plain strided tensor (sparse, quantized,
    a conjugate or negative view: moved as ``to`` moves them)."""
    if t.layout != torch.strided or t.is_contiguous() or t.is_quantized or t.is_conj() or t.is_neg():
        return True
    return torch.empty_like(t, device="meta").stride() == t.stride()


def _with_its_buffer(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` as the same view (sizes, strides, offset) of a copy of its whole
    storage."""
    storage = t.untyped_storage()
    flat = t.new_empty(0).set_(storage, 0, (storage.nbytes() // t.element_size(),), (1,))
    return flat.to(device).as_strided(t.shape, t.stride(), t.storage_offset())


def meta_like(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with ``t``'s dtype, sizes, strides and storage offset (over a storage at
    least as large as ``t``'s): an operator run on it computes its result's geometry, and makes
    its checks, without ``t``'s memory."""
    storage_numel = t.untyped_storage().nbytes() // max(t.element_size(), 1)
    needed = t.storage_offset() + sum((s - 1) * st for s, st in zip(t.shape, t.stride()) if s > 0) + 1
    base = torch.empty(max(storage_numel, needed), dtype=t.dtype, device="meta")
    return base.as_strided(t.shape, t.stride(), t.storage_offset())


def _device_views(op, bound: Dict[str, Any], index: int, source: torch.Tensor, mover: _Mover):
    """The view ``op`` returns at ``index``, made on the device from ``source``'s storage."""
    meta_bound = {k: (meta_like(v) if mover.is_device_tensor(v) else v) for k, v in bound.items()}
    args, kwargs = schema.split_call(op, meta_bound)
    out = op(*args, **kwargs)
    if len(op._schema.returns) > 1:
        out = out[index]

    def make(m: torch.Tensor) -> torch.Tensor:
        if m.dtype != source.dtype:
            raise RouteUnavailable(f"{schema.qualified_name(op)} returns a view with another dtype, "
                                   "which cannot be rebuilt from the device tensor's storage")
        return source.as_strided(m.shape, m.stride(), m.storage_offset())

    return [make(m) for m in out] if isinstance(out, (list, tuple)) else make(out)


def _scalars_as_tensors(op, bound: Dict[str, Any]) -> None:
    # the boxed call hands a wrapped-number tensor argument over as a Python number
    for arg in op._schema.arguments:
        value = bound.get(arg.name)
        if isinstance(value, (bool, int, float, complex)) and str(arg.type) in ("Tensor", "Optional[Tensor]"):
            bound[arg.name] = torch.tensor(value)


def run(op, args: tuple, kwargs: dict, device_type: str) -> Tuple[Any, int]:
    """Run ``op`` on host copies; returns (result with device tensors, bytes copied)."""
    bound, host_bound, result, mover = _on_host(op, args, kwargs, device_type)
    _state.transfer = True
    try:
        for name in schema.written_args(op):
            mover.write_back(bound[name], host_bound[name])
        result = _results(op, bound, result, mover)
    finally:
        _state.transfer = False
    return result, mover.bytes


def _on_host(op, args: tuple, kwargs: dict, device_type: str):
    """Run ``op``'s host kernel on host copies of the arguments: (the arguments bound by name,
    their host copies, the host result, the mover that copied them)."""
    bound = schema.bind(op, args, kwargs)
    _scalars_as_tensors(op, bound)
    host_op, rewrite = host_operator(op)
    mover = _Mover(device_type)
    _state.transfer = True
    try:
        host_bound = {name: mover.to_host(value) for name, value in bound.items()}
    finally:
        _state.transfer = False
    call_bound = rewrite(host_bound) if rewrite else host_bound
    h_args, h_kwargs = schema.split_call(host_op, call_bound)
    running = getattr(_state, "host_ops", ())
    _state.host_ops = running + (op, host_op)
    try:
        result = host_op(*h_args, **h_kwargs)
    finally:
        _state.host_ops = running
    if mover.device is None:
        raise RouteUnavailable("no argument says which device the result belongs on")
    return bound, host_bound, result, mover


def check_on_host(op, args: tuple, kwargs: dict, device_type: str) -> None:
    """Raise what the CPU kernel of ``op`` raises for these arguments (run on host copies, the
    result dropped): the operator's own argument and dtype checks, which a decomposition does
    not carry (``index_fill_`` with a complex value into a float tensor, ``adaptive_max_pool2d``
    of integers). Nothing happens where the CPU cannot serve as the reference: no CPU kernel, a
    sampling operator (it would draw from the host's generator), or arguments naming no
    device."""
    if can_run(op) is not None or torch.Tag.nondeterministic_seeded in op.tags:
        return
    try:
        _on_host(op, args, kwargs, device_type)
    except RouteUnavailable:
        pass


def _results(op, bound: Dict[str, Any], result: Any, mover: _Mover) -> Any:
    aliases = schema.return_aliases(op)
    if not aliases:
        return None
    single = len(aliases) == 1
    values = [result] if single else list(result)
    out = []
    for i, (value, alias) in enumerate(zip(values, aliases)):
        if alias is None:
            out.append(mover.to_device(value))
        elif alias[1]:
            out.append(bound[alias[0]])
        else:
            out.append(_device_views(op, bound, i, bound[alias[0]], mover))
    return out[0] if single else tuple(out)
