"""The composite route: run an operator as a decomposition (PyTorch's decomposition tables)
into operators the chip runs.

A decomposition is *tried*, not proven in advance. While one runs, its operator sits on a
per-thread stack; the router raises :class:`CompositeAbort` when a part re-enters an operator on
the stack (a loop) or needs the CPU fallback or is unsupported (the chip cannot run that part).
The abort unwinds to the frame it names, which records why and takes its next route.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_flatten

from . import schema
from .fallback import meta_like

Decomposition = Callable[..., Any]


class CompositeAbort(Exception):
    """Unwinds a running decomposition of ``target``; ``reason`` says why it cannot serve."""

    def __init__(self, target, reason: str):
        super().__init__(reason)
        self.target = target
        self.reason = reason


_local = threading.local()


def stack() -> List[Any]:
    """The operators whose decompositions are running on this thread, outermost first."""
    frames = getattr(_local, "frames", None)
    if frames is None:
        frames = _local.frames = []
    return frames


def table():
    """PyTorch's decomposition table (importing it takes a moment: done at activation)."""
    from torch._decomp import decomposition_table

    return decomposition_table


_COMPLEX = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}


def _meta_twin(t: torch.Tensor) -> torch.Tensor:
    """:func:`~.fallback.meta_like` with ``t``'s conjugate bit too: ATen's checks of a view, run
    on it, refuse what they refuse on a device, in their words."""
    twin = meta_like(t)
    return twin.conj() if t.is_conj() else twin


def _view_as_complex(self):
    torch.view_as_complex(_meta_twin(self))
    return self.view(_COMPLEX[self.dtype]).squeeze(-1)


_REAL = {v: k for k, v in _COMPLEX.items()}


def _view_as_real(self):
    torch.view_as_real(_meta_twin(self))
    return self.unsqueeze(-1).view(_REAL[self.dtype])


def _math_attention(*args, **kwargs) -> int:
    """The composite (math) attention, while the program allows one of the backends the host's
    kernels have, math or flash (``torch.backends.cuda.math_sdp_enabled()``,
    ``flash_sdp_enabled()``, set by ``sdpa_kernel``): the chip runs either as math. With both
    disabled, the error the CPU raises (and CUDA, for inputs its other kernels do not take)."""
    from torch.nn.attention import SDPBackend

    if not (torch.backends.cuda.math_sdp_enabled() or torch.backends.cuda.flash_sdp_enabled()):
        raise RuntimeError("No viable backend for scaled_dot_product_attention was found. This is likely "
                           "due to turning off both the math kernel and the fused kernels.")
    return int(SDPBackend.MATH.value)


def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """``_thnn_fused_lstm_cell`` (what ``nn.LSTM`` runs on any non-CPU device): returns
    (hy, cy, workspace), the workspace holding the activated gates [i, f, g, o]."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    return o * cy.tanh(), cy, torch.cat([i, f, g, o], 1)


def _fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """``_thnn_fused_lstm_cell_backward_impl``: (grad of the gates, grad of cx, grad of the
    bias) from the workspace :func:`_fused_lstm_cell` saved."""
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    grad_c = torch.zeros_like(cy) if grad_cy is None else grad_cy
    grad_o = torch.zeros_like(cy)
    if grad_hy is not None:
        grad_c = grad_c + grad_hy * o * (1 - tanh_cy * tanh_cy)
        grad_o = grad_hy * tanh_cy
    grad_gates = torch.cat([
        grad_c * g * i * (1 - i), grad_c * cx * f * (1 - f), grad_c * i * (1 - g * g),
        grad_o * o * (1 - o)], 1)
    return grad_gates, grad_c * f, grad_gates.sum(0)


def _softmax_backward_data(grad_output, output, dim, input_dtype):
    """``_softmax_backward_data`` in the order of operations of the CPU kernel (and CUDA's):
    ``output * (grad_output - sum(grad_output * output, dim))``, in float32 for float16/bfloat16
    inputs, rounded once to ``input_dtype``. torch's decomposition computes
    ``grad_output * output - output * sum(...)``, which rounds differently: the gradients of an
    attention with dropout drifted from the CPU's by 1e-5."""
    grad, out = _upcast(grad_output), _upcast(output)
    grad_input = (grad - (grad * out).sum(dim, keepdim=True)) * out
    return grad_input.to(input_dtype).contiguous()


#: decompositions that keep view semantics (views into the same storage), by overload
VIEW_DECOMPOSITIONS = {
    "aten::view_as_complex": (_view_as_complex, "view.dtype then squeeze (a view)"),
    "aten::view_as_real": (_view_as_real, "unsqueeze then view.dtype (a view)"),
}
#: decompositions beyond torch's tables, by overload (an entry for a functional overload serves
#: its in-place and ``out=`` overloads too), looked up before torch's tables
EXTRA_DECOMPOSITIONS = {
    # which fused attention kernel to use: none, the composite (math) attention
    "aten::_fused_sdp_choice": (_math_attention, "the composite (math) attention"),
    # nn.LSTM on a non-CPU device runs the fused cell, which only CUDA kernels implement
    "aten::_thnn_fused_lstm_cell": (_fused_lstm_cell, "LSTM cell from sigmoid/tanh/mul/add"),
    "aten::_thnn_fused_lstm_cell_backward_impl": (
        _fused_lstm_cell_backward, "LSTM cell backward from the saved gates"),
    # softmax's backward, computed as the CPU kernel computes it
    "aten::_softmax_backward_data": (_softmax_backward_data, "softmax backward in the CPU kernel's order"),
}


def find(op) -> Optional[Tuple[Decomposition, str]]:
    """(decomposition callable taking the operator's own arguments, where it comes from), or None.

    Views have none unless listed in :data:`VIEW_DECOMPOSITIONS` (a table decomposition would
    return a copy, not a view). An in-place or ``out=`` overload runs the decomposition of its
    functional variant and writes the result into the written arguments."""
    name = schema.qualified_name(op)
    if schema.is_view(op):
        return VIEW_DECOMPOSITIONS.get(name)
    if name in EXTRA_DECOMPOSITIONS:
        return EXTRA_DECOMPOSITIONS[name]
    decompositions = table()
    if not schema.written_args(op):
        fn = decompositions.get(op)
        return (_in_opmath(op, fn), "torch._decomp") if fn is not None else None
    functional = schema.functional_variant(op)
    if functional is None:
        return None
    extra = EXTRA_DECOMPOSITIONS.get(schema.qualified_name(functional))
    if extra is not None:
        return _writing(op, functional, extra[0]), f"{extra[1]}, written into the output"
    if functional in decompositions:
        fn = _in_opmath(functional, decompositions[functional])
        return _writing(op, functional, fn), f"torch._decomp of {schema.qualified_name(functional)}, written into the output"
    return None


#: the dtype a device kernel computes a low-precision dtype in (PyTorch's ``opmath_type``)
OPMATH = {torch.float16: torch.float32, torch.bfloat16: torch.float32, torch.complex32: torch.complex64}


def _upcast(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(OPMATH[value.dtype]) if value.dtype in OPMATH else value
    if isinstance(value, torch.dtype):  # a ``dtype=`` to compute in: the upcast one (rounded after)
        return OPMATH.get(value, value)
    if isinstance(value, (list, tuple)):
        return type(value)(_upcast(v) for v in value)
    return value


def _has_low_precision(values) -> bool:
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.dtype in OPMATH:
                return True
        elif isinstance(value, (list, tuple)) and _has_low_precision(value):
            return True
    return False


def _round_to(value: Any, like: Any) -> Any:
    if isinstance(value, torch.Tensor) and isinstance(like, torch.Tensor) and value.dtype != like.dtype:
        return value.to(like.dtype)
    if isinstance(value, (list, tuple)) and isinstance(like, (list, tuple)):
        return type(value)(_round_to(v, w) for v, w in zip(value, like))
    return value


def _in_opmath(op, fn: Decomposition) -> Decomposition:
    """``fn`` computing as a device kernel computes: float16/bfloat16 (complex32) tensor
    arguments, and a ``dtype`` argument naming one, in float32 (complex64), each result rounded
    once to the dtype the operator returns (its meta kernel says which). A decomposition run in
    the low precision itself
    rounds after every step (a bfloat16 ``index_add`` of repeated indices drifted from the
    CPU kernel's sum). Calls without low-precision tensors, and operators without a meta
    kernel, run ``fn`` as it is."""

    def run(*args, **kwargs):
        if not (_has_low_precision(args) or _has_low_precision(kwargs.values())):
            return fn(*args, **kwargs)
        try:
            expected = op(*_meta(args), **{k: _meta(v) for k, v in kwargs.items()})
        except Exception:
            return fn(*args, **kwargs)
        result = fn(*_upcast(args), **{k: _upcast(v) for k, v in kwargs.items()})
        if result is NotImplemented:
            return result
        return _round_to(result, expected)

    return run


def _writing(op, functional, fn: Decomposition) -> Decomposition:
    written = schema.written_args(op)
    takes = {a.name for a in functional._schema.arguments}

    def run(*args, **kwargs):
        bound = schema.bind(op, args, kwargs)
        f_args, f_kwargs = schema.split_call(functional, {k: v for k, v in bound.items() if k in takes})
        result = fn(*f_args, **f_kwargs)
        if result is NotImplemented:
            return result
        results = result if len(written) > 1 else (result,)
        for name, value in zip(written, results):
            _write(op, bound[name], value)
        returned = [bound[alias[0]] for alias in schema.return_aliases(op) if alias is not None]
        if not op._schema.returns:
            return None
        return returned[0] if len(returned) == 1 else tuple(returned)

    return run


def _write(op, target: Any, value: Any) -> None:
    if isinstance(target, (list, tuple)):
        for t, v in zip(target, value):
            _write(op, t, v)
        return
    if not torch.can_cast(value.dtype, target.dtype):
        raise RuntimeError(
            f"{schema.qualified_name(op)}: result type {value.dtype} can't be cast to the desired "
            f"output type {target.dtype}"
        )
    if "self" in schema.written_args(op) and target.shape != value.shape:
        raise RuntimeError(
            f"{schema.qualified_name(op)}: output with shape {list(target.shape)} doesn't match "
            f"the broadcast shape {list(value.shape)}"
        )
    if target.shape != value.shape:
        target.resize_(value.shape)
    target.copy_(value)


def run(op, fn: Decomposition, args: tuple, kwargs: dict) -> Any:
    """Run ``fn`` for ``op`` with ``op`` on the stack (so that re-entry is caught). A
    decomposition that declines the arguments (returns ``NotImplemented``) aborts."""
    frames = stack()
    frames.append(op)
    try:
        result = fn(*args, **kwargs)
    finally:
        frames.pop()
    if result is NotImplemented:
        raise CompositeAbort(op, "its decomposition does not handle these arguments")
    return result


def _meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.device.type != "meta":
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v) for v in value)
    if isinstance(value, torch.device):
        return torch.device("meta")
    return value


def _signature_of(value: Any) -> list:
    flat, _ = tree_flatten(value)
    return [(tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__ for v in flat]


def mismatch(op, args: tuple, kwargs: dict, result: Any) -> Optional[str]:
    """Why a decomposition's result cannot stand for ``op``'s (shapes or dtypes differ from
    what the operator's meta kernel gives), or None when they agree or there is no meta kernel."""
    try:
        expected = op(*_meta(args), **{k: _meta(v) for k, v in kwargs.items()})
    except Exception:
        return None
    want, got = _signature_of(expected), _signature_of(result)
    if want != got:
        return f"its decomposition returns {got}, the operator {want}"
    return None
