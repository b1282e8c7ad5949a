"""The sim's native kernels.

Every native overload gets a PrivateUse1 kernel that runs PyTorch's own CPU kernel of the same
overload on host views of the sim tensors (:mod:`flagos_torchfl.sim.runtime.tensors`) and hands back sim
tensors with the semantics a device kernel has:

* in-place and ``out=`` overloads return the very tensors they were given, with any change of
  their size/stride/offset (``resize_`` of an output, ``unsqueeze_``) applied to the sim tensor;
  an ``out=`` tensor too small for the result is grown through the sim allocator;
* an output that shares memory with an input (views, ``detach``, ``_unsafe_view`` ...) is a sim
  tensor on the input's storage with the view's geometry; any other output is copied into fresh
  memory from the sim allocator (outputs that share one fresh buffer stay views of one storage);
  a sparse or quantized output (``_to_sparse``) is moved to the device whole;
* a ``device=`` argument naming a sim device is replaced by ``cpu`` for the CPU call and chooses
  the device of the outputs; naming ``cpu`` (``_to_copy`` back to the host) leaves them on the CPU;
* random overloads draw from the device's own generator, or the sim generator passed to them,
  and advance its offset (see :class:`flagos_torchfl.sim.runtime.state.SimGenerator`);
* like a real device, tensors on two sim devices, or a sim tensor with a CPU tensor that is not a
  0-dim scalar, are refused (except by copies and by indexing with CPU indices); a CPU tensor
  the kernel would write (an ``out=`` argument, ``self`` of an in-place overload) is refused
  whatever its size, as CUDA refuses ``torch.nonzero(cuda_t, out=cpu_t)``.

Allocation, copies between host and devices, ``set_`` and ``resize_`` have kernels of their own
(:data:`SPECIAL_KERNELS`): they manage sim storages and never run a CPU kernel on them.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Iterable

import torch
from torch._prims_common import suggest_memory_format

from ..runtime import state, tensors

logger = logging.getLogger("flagos_torchfl.sim")

_CPU = torch.device("cpu")
_EMPTY = torch.ops.aten.empty.memory_format
_CONJ = torch.ops.aten._conj.default
_NEG_VIEW = torch.ops.aten._neg_view.default

_CPU_INDICES_OK = frozenset({
    "aten::index.Tensor", "aten::index.Tensor_out", "aten::index_put", "aten::index_put_",
    "aten::index_put.out", "aten::_index_put_impl_", "aten::_index_put_impl",
    "aten::_index_put_impl.out",
})
"""Overloads that, as on CUDA, accept CPU index tensors beside device tensors."""


def _conv_backward_on_host(grad_output, input, weight, stride, padding, dilation, transposed,
                           output_padding, groups, output_mask):
    out_channels = weight.size(1) * groups if transposed else weight.size(0)
    return torch.ops.aten.convolution_backward.default(
        grad_output, input, weight, [out_channels], stride, padding, dilation, transposed,
        output_padding, groups, output_mask)


HOST_EQUIVALENTS: dict[str, Callable] = {
    "aten::convolution_overrideable": torch.ops.aten.convolution.default,
    "aten::convolution_backward_overrideable": _conv_backward_on_host,
}
"""PyTorch's stubs for out-of-tree devices (``*_overrideable``, whose CPU kernel only raises) that
a device implements itself: the sim runs the CPU operator each stands for."""


class _Signature:
    """What a generic kernel needs to know about one overload's schema, computed once."""

    def __init__(self, op: torch._ops.OpOverload):
        schema = op._schema
        self.op = op
        self.name = op.name()
        #: what runs on the host views: the overload itself, or what a stub stands for
        self.host = HOST_EQUIVALENTS.get(self.name, op)
        args = schema.arguments
        self.position = {a.name: i for i, a in enumerate(args)}
        self.kwarg_only = frozenset(a.name for a in args if a.kwarg_only)
        writers: dict[str, str] = {}
        for a in args:
            if a.alias_info is not None and a.alias_info.is_write:
                for alias_set in a.alias_info.before_set:
                    writers[alias_set] = a.name
        self.written = tuple(dict.fromkeys(writers.values()))
        self.outs = tuple(n for n in self.written if n in self.kwarg_only)
        self.return_writer: list[str | None] = []
        for r in schema.returns:
            written = r.alias_info is not None and r.alias_info.is_write
            sets = r.alias_info.before_set if written else ()
            self.return_writer.append(next((writers[s] for s in sets if s in writers), None))
        self.generator = next((a.name for a in args if str(a.type) == "Optional[Generator]"), None)
        self.seeded = torch.Tag.nondeterministic_seeded in op.tags
        self.cpu_indices_ok = self.name in _CPU_INDICES_OK

    def get(self, args: tuple, kwargs: dict, name: str) -> Any:
        i = self.position[name]
        if name not in self.kwarg_only and i < len(args):
            return args[i]
        return kwargs.get(name)

    def put(self, args: list, kwargs: dict, name: str, value: Any) -> None:
        i = self.position[name]
        if name not in self.kwarg_only and i < len(args):
            args[i] = value
        else:
            kwargs[name] = value


def _with_bits_of(t: torch.Tensor, view: torch.Tensor) -> torch.Tensor:
    """``view`` (a host view of sim tensor ``t``) with ``t``'s conjugate and negative bits."""
    if t.is_conj():
        view = _CONJ(view)
    if t.is_neg():
        view = _NEG_VIEW(view)
    return view


def _view_on(storage: torch.UntypedStorage, t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over ``storage`` with ``t``'s dtype, geometry and conjugate/negative bits."""
    view = _EMPTY([0], dtype=t.dtype, device=_CPU)
    return _with_bits_of(t, view.set_(storage, t.storage_offset(), t.size(), t.stride()))


def _on_host(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor that reads and writes what ``t`` holds: ``t`` itself if it is on the CPU."""
    if t.device.type != state.DEVICE_TYPE:
        return t
    return _with_bits_of(t, tensors.host_view(t))


class _Call:
    """One kernel invocation: host views handed to the CPU kernel and how to map results back."""

    def __init__(self, name: str):
        self.name = name
        self.indices: list[int] = []
        self.foreign: torch.Tensor | None = None
        self.target: int | None = None
        self.keep_cpu = False
        self.views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.host_storages: dict[int, torch.UntypedStorage] = {}
        self.fresh: dict[int, torch.UntypedStorage] = {}

    # -- into the CPU call ------------------------------------------------------------------
    def host(self, x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if x.device.type == state.DEVICE_TYPE:
                return self.view_of(x)
            if x.dim() != 0 and self.foreign is None:
                self.foreign = x
            return x
        if isinstance(x, (list, tuple)):
            return type(x)(self.host(e) for e in x)
        if isinstance(x, torch.device):
            if x.type == state.DEVICE_TYPE:
                self.target = state.to_index(x)
                return _CPU
            self.keep_cpu = True
        return x

    def view_of(self, t: torch.Tensor) -> torch.Tensor:
        known = self.views.get(id(t))
        if known is not None:
            return known[1]
        if t.layout != torch.strided:
            raise RuntimeError(f"sim supports strided tensors only, got {t.layout} in {self.name}")
        index = t.device.index
        if index not in self.indices:
            self.indices.append(index)
        storage = t.untyped_storage()
        cpu_storage = self.host_storages.get(storage._cdata)
        if cpu_storage is None:
            cpu_storage = self.host_storages[storage._cdata] = tensors.host_storage(storage)
        view = _view_on(cpu_storage, t)
        self.views[id(t)] = (t, view)
        return view

    def refresh(self) -> None:
        """Give every host view its sim tensor's geometry again (a CPU kernel that failed may
        have resized one)."""
        for t, view in self.views.values():
            view.set_(view.untyped_storage(), t.storage_offset(), t.size(), t.stride())

    def check_devices(self, allow_cpu: bool) -> None:
        if len(self.indices) > 1:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{state.device_name(self.indices[0])} and {state.device_name(self.indices[1])}! "
                f"(in {self.name})"
            )
        if self.indices and self.foreign is not None and not allow_cpu:
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{state.device_name(self.indices[0])} and {self.foreign.device}! (in {self.name})"
            )

    def check_written(self, name: str, value: Any) -> None:
        """Refuse a tensor on another device as the written argument ``name`` of a call on
        sim tensors (a 0-dim CPU tensor passes as an input, never as an output)."""
        if isinstance(value, (list, tuple)):
            for v in value:
                self.check_written(name, v)
            return
        if (self.indices and isinstance(value, torch.Tensor)
                and value.device.type != state.DEVICE_TYPE):
            raise RuntimeError(
                "Expected all tensors to be on the same device, but found at least two devices, "
                f"{state.device_name(self.indices[0])} and {value.device}! (when checking "
                f"argument for argument {name} in method {self.name})")

    def output_index(self) -> int:
        if self.target is not None:
            return self.target
        return self.indices[0] if self.indices else state.current_device()

    # -- back from the CPU call -------------------------------------------------------------
    def to_sim(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return self.tensor_to_sim(value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_sim(v) for v in value)
        return value

    def tensor_to_sim(self, v: torch.Tensor) -> torch.Tensor:
        if v.layout != torch.strided or v.is_quantized:  # a sparse or quantized result (`_to_sparse`
            # of a dense operand): moved whole, its copy served by the device's kernels for that kind
            # of tensor, or refused with the dispatcher's words where it has none
            return v if self.keep_cpu else v.to(torch.device(state.DEVICE_TYPE, self.output_index()))
        cpu_storage = v.untyped_storage()
        owner = getattr(cpu_storage, "_fl_owner", None)
        if self.keep_cpu:
            return v.clone() if owner is not None else v
        if owner is None:
            owner = self.fresh.get(cpu_storage._cdata)
            if owner is None:
                owner = tensors.copy_storage_to_sim(cpu_storage, self.output_index())
                self.fresh[cpu_storage._cdata] = owner
        out = tensors.tensor_on(owner, v.dtype, v.size(), v.stride(), v.storage_offset())
        if v.is_conj():
            torch._C._set_conj(out, True)
        if v.is_neg():
            torch._C._set_neg(out, True)
        return out

    def adopt(self, sim: torch.Tensor, result: torch.Tensor) -> None:
        """Make written sim tensor ``sim`` show ``result`` (its host view after the CPU call)."""
        geometry = (tuple(result.size()), tuple(result.stride()), result.storage_offset())
        owner = getattr(result.untyped_storage(), "_fl_owner", None)
        if owner is not None and owner._cdata == sim.untyped_storage()._cdata:
            if geometry != (tuple(sim.size()), tuple(sim.stride()), sim.storage_offset()):
                tensors.set_geometry(sim, *geometry)
            return
        _write_into(sim, result)


def _write_into(sim: torch.Tensor, value: torch.Tensor) -> None:
    """Give sim tensor ``sim`` the geometry and contents of CPU tensor ``value``, growing its
    storage in place if needed."""
    size, stride = tuple(value.size()), tuple(value.stride())
    offset = sim.storage_offset()
    storage = sim.untyped_storage()
    need = tensors.storage_bytes_needed(size, stride, offset, sim.element_size())
    tensors.grow_storage(storage, need)
    tensors.set_geometry(sim, size, stride, offset)
    tensors.host_view(sim).copy_(value)


def _generic_kernel(op: torch._ops.OpOverload) -> Callable:
    sig = _Signature(op)

    def kernel(*args, **kwargs):
        call = _Call(sig.name)
        cargs = [call.host(a) for a in args]
        ckwargs = {k: call.host(v) for k, v in kwargs.items()}
        call.check_devices(sig.cpu_indices_ok)
        for name in sig.written:
            call.check_written(name, sig.get(args, kwargs, name))
        index = call.output_index()
        if sig.generator is not None:
            gen = sig.get(args, kwargs, sig.generator)
            if gen is None:
                gen = state.generator(index)
                sig.put(cargs, ckwargs, sig.generator, gen)
            gen = state.sim_generator(gen)
            if gen is not None:
                result = state.run_drawing(gen, lambda: _run(sig, call, cargs, ckwargs))
                return _finish(sig, call, args, kwargs, cargs, ckwargs, result)
        elif sig.seeded:
            result = state.run_with_device_rng(index, lambda: _run(sig, call, cargs, ckwargs))
            return _finish(sig, call, args, kwargs, cargs, ckwargs, result)
        result = _run(sig, call, cargs, ckwargs)
        return _finish(sig, call, args, kwargs, cargs, ckwargs, result)

    kernel.__name__ = f"sim_{sig.name.replace('::', '_').replace('.', '_')}"
    kernel.__qualname__ = kernel.__name__
    return kernel


def _run(sig: _Signature, call: _Call, cargs: list, ckwargs: dict) -> Any:
    try:
        return sig.host(*cargs, **ckwargs)
    except RuntimeError as e:
        if not sig.outs or "not resizable" not in str(e):
            raise
    # An out= tensor must grow, which a host view's memory cannot. Run instead on CPU copies of
    # the call's memory, which can: tensors sharing memory on the device share a copy, the same
    # tensor is one tensor, so the kernel's checks (an input that is its output) see what they
    # see on a device; the written sim tensors then take the results (see ``_finish``).
    call.refresh()
    copies: dict = {}
    cargs[:] = [_on_copies(a, copies) for a in cargs]
    ckwargs.update({k: _on_copies(v, copies) for k, v in ckwargs.items()})
    return sig.host(*cargs, **ckwargs)


def _on_copies(x: Any, copies: dict) -> Any:
    """``x`` with every host view of sim memory replaced by the same view of a CPU copy of that
    memory (one copy per storage, one view per view)."""
    if isinstance(x, (list, tuple)):
        return type(x)(_on_copies(e, copies) for e in x)
    if not isinstance(x, torch.Tensor) or getattr(x.untyped_storage(), "_fl_owner", None) is None:
        return x
    if ("view", id(x)) not in copies:
        storage = x.untyped_storage()
        if ("storage", storage._cdata) not in copies:
            copies["storage", storage._cdata] = storage.clone()
        copies["view", id(x)] = (x, _view_on(copies["storage", storage._cdata], x))
    return copies["view", id(x)][1]


def _finish(sig: _Signature, call: _Call, args: tuple, kwargs: dict, cargs: list, ckwargs: dict,
            result: Any) -> Any:
    for name in sig.written:
        _sync_written(call, sig.get(args, kwargs, name), sig.get(cargs, ckwargs, name))
    if len(sig.return_writer) == 1:
        writer = sig.return_writer[0]
        return sig.get(args, kwargs, writer) if writer is not None else call.to_sim(result)
    if not sig.return_writer:
        return result
    return tuple(
        sig.get(args, kwargs, writer) if writer is not None else call.to_sim(value)
        for writer, value in zip(sig.return_writer, result)
    )


def _sync_written(call: _Call, original: Any, passed: Any) -> None:
    if isinstance(original, torch.Tensor):
        if original.device.type == state.DEVICE_TYPE:
            call.adopt(original, passed)
    elif isinstance(original, (list, tuple)):
        for o, p in zip(original, passed):
            _sync_written(call, o, p)


# -- kernels of their own ------------------------------------------------------------------------
def _index_of(device: torch.device | None) -> int:
    if device is None or device.index is None:
        return state.current_device()
    return state.check_index(device.index)


def _check_factory(layout: torch.layout | None, pin_memory: bool | None) -> None:
    if layout not in (None, torch.strided):
        raise RuntimeError(f"sim supports strided tensors only, not {layout}")
    if pin_memory:
        raise RuntimeError("Only dense CPU tensors can be pinned")


def _empty_memory_format(size, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=None):
    _check_factory(layout, pin_memory)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    stride = None
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        stride = _EMPTY(size, dtype=dtype, device="meta", memory_format=memory_format).stride()
    return tensors.empty(size, stride, dtype, _index_of(device))


def _empty_strided(size, stride, dtype=None, layout=None, device=None, pin_memory=None):
    _check_factory(layout, pin_memory)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    return tensors.empty(size, stride, dtype, _index_of(device))


def _copy_(self, src, non_blocking=False):
    for t, role in ((self, "to"), (src, "from")):
        if t.device.type not in (state.DEVICE_TYPE, "cpu"):
            raise RuntimeError(f"sim cannot copy {role} {t.device}")
    destination = _on_host(self)
    if (self.device.type == src.device.type == state.DEVICE_TYPE
            and self.untyped_storage()._cdata == src.untyped_storage()._cdata):
        # within one sim storage, both views on one host storage: the CPU copy's overlap checks see it
        source = _view_on(destination.untyped_storage(), src)
    else:
        source = _on_host(src)
    destination.copy_(source)
    return self


def _is_set_to(self, tensor):
    """Whether both tensors show the same memory the same way (storage, offset, sizes, strides),
    as every device's kernel answers."""
    return (self.untyped_storage()._cdata == tensor.untyped_storage()._cdata
            and self.storage_offset() == tensor.storage_offset() and self.size() == tensor.size()
            and self.stride() == tensor.stride())


def _copy_from(self, dst, non_blocking=False):
    return _copy_(dst, self, non_blocking)


def _copy_from_and_resize(self, dst):
    if tuple(dst.size()) != tuple(self.size()):
        if dst.device.type == state.DEVICE_TYPE:
            _resize_(dst, self.size())
        else:
            dst.resize_(self.size())
    return _copy_(dst, self)


def _strides_for(size, memory_format) -> list[int]:
    if memory_format in (None, torch.contiguous_format, torch.preserve_format):
        return tensors.contiguous_strides(size)
    return list(_EMPTY(size, device="meta", memory_format=memory_format).stride())


def _resize_(self, size, memory_format=None):
    size = [int(s) for s in size]
    if any(s < 0 for s in size):
        raise RuntimeError(f"Trying to create tensor with negative dimension: {tuple(size)}")
    stride = _strides_for(size, memory_format)
    offset = self.storage_offset()
    need = tensors.storage_bytes_needed(size, stride, offset, self.element_size())
    tensors.grow_storage(self.untyped_storage(), need)
    tensors.set_geometry(self, size, stride, offset)
    return self


def _resize_as_(self, the_template, memory_format=None):
    """``resize_`` to the template's size; ``preserve_format`` takes the template's memory
    format (channels-last strides stay channels-last), as the CPU kernel does."""
    if memory_format is torch.preserve_format:
        memory_format = suggest_memory_format(the_template)
    return _resize_(self, the_template.size(), memory_format)


def _check_sim_storage(self, source) -> None:
    if source.device != self.device:
        raise RuntimeError(
            f"Attempted to set the storage of a tensor on device \"{self.device}\" to a storage "
            f"on different device \"{source.device}\".  This is no longer allowed; the devices "
            "must match."
        )


def _set_storage_offset(self, source, storage_offset, size, stride=()):
    _check_sim_storage(self, source)
    stride = tensors.contiguous_strides(size) if len(stride) == 0 else stride
    need = tensors.storage_bytes_needed(size, stride, storage_offset, self.element_size())
    tensors.grow_storage(source, need)
    return tensors.set_geometry(self, size, stride, storage_offset, storage=source)


def _set_storage(self, source):
    _check_sim_storage(self, source)
    n = source.nbytes() // self.element_size()
    return tensors.set_geometry(self, [n], [1], 0, storage=source)


def _set_tensor(self, source):
    if source.dtype != self.dtype:
        raise RuntimeError(
            f"Could not set tensor of type {source.dtype} to a tensor of type {self.dtype}")
    return _set_storage_offset(self, source.untyped_storage(), source.storage_offset(),
                               source.size(), source.stride())


def _set_empty(self):
    storage = tensors.new_storage(0, self.device.index)
    return tensors.set_geometry(self, [0], [1], 0, storage=storage)


def _record_stream(self, s):
    """Nothing to track: sim work runs inline, so no stream can still be using ``self``."""


SPECIAL_KERNELS: dict[str, Callable] = {
    "aten::empty.memory_format": _empty_memory_format,
    "aten::empty_strided": _empty_strided,
    "aten::copy_": _copy_,
    "aten::is_set_to": _is_set_to,
    "aten::_copy_from": _copy_from,
    "aten::_copy_from_and_resize": _copy_from_and_resize,
    "aten::resize_": _resize_,
    "aten::resize_as_": _resize_as_,
    "aten::set_": _set_empty,
    "aten::set_.source_Storage": _set_storage,
    "aten::set_.source_Storage_storage_offset": _set_storage_offset,
    "aten::set_.source_Tensor": _set_tensor,
    "aten::record_stream": _record_stream,
}
"""Overloads whose sim kernels manage sim storages themselves instead of running a CPU kernel."""


@functools.lru_cache(maxsize=None)
def kernel_for(name: str) -> Callable:
    """The sim kernel of fully qualified overload ``name``."""
    special = SPECIAL_KERNELS.get(name)
    if special is not None:
        return special
    packet, _, overload = name[len("aten::"):].partition(".")
    return _generic_kernel(getattr(getattr(torch.ops.aten, packet), overload or "default"))


_observer: Callable[[str, int], None] | None = None


def set_observer(observer: Callable[[str, int], None] | None) -> None:
    """Call ``observer(overload name, nanoseconds)`` after every native kernel call from now on
    (None: stop). One observer at a time; it runs on the calling thread."""
    global _observer
    _observer = observer


def _observed(name: str, kernel: Callable) -> Callable:
    def run(*args, **kwargs):
        state.begin_use()
        observer = _observer
        if observer is None:
            return kernel(*args, **kwargs)
        start = time.perf_counter_ns()
        try:
            return kernel(*args, **kwargs)
        finally:
            observer(name, time.perf_counter_ns() - start)

    run.__name__ = run.__qualname__ = getattr(kernel, "__name__", "sim_kernel")
    return run


def register(library: torch.library.Library, names: Iterable[str]) -> list[str]:
    """Register the sim kernel of every overload in ``names`` on PrivateUse1 through
    ``library`` (an ``aten`` IMPL library kept alive by the caller); returns the names
    registered, sorted. Each kernel reports to the observer of :func:`set_observer`."""
    done = []
    for name in sorted(names):
        library.impl(name[len("aten::"):], _observed(name, kernel_for(name)), "PrivateUse1")
        done.append(name)
    logger.debug("sim: %d native kernels registered", len(done))
    return done
