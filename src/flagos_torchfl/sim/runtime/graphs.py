"""Device graphs where work runs inline: CUDA graphs' capture and replay for the sim (its device
module's ``<TYPE>Graph``: ``torch.sim.SIMGraph``, ``torch.npu.NPUGraph`` under the Ascend
profile...) and for the host under the cpu backend.

**Capture.** Between ``capture_begin`` and ``capture_end`` a ``TorchDispatchMode`` records every
operator call that touches a tensor of the graph's device, at the dispatcher's level (below
autograd, above the device's kernels, whatever implements them). The calls also run, so the
tensors the capture makes hold values at once (a CUDA capture runs nothing until the first
replay); the memory that existed before the capture and that a call wrote is saved before that
write and put back at ``capture_end``, and so is the device's generator, so the capture changes
nothing the program had, as on CUDA (a captured ``optimizer.step()`` updates the parameters at
each replay, not at the capture; the random numbers drawn after the capture are those drawn
without it). Calls
on other devices only run, as on CUDA. A replay writes to the same memory the capture did, where
the program's static inputs and outputs are.

**Memory.** On the sim the recorded calls allocate from the graph's private pool of the device's
allocator (``pool``: a token of :func:`graph_pool_handle` or another graph's :meth:`DeviceGraph.pool`,
shared with that graph; else a pool of its own): a tensor the capture made and the program dropped
is free in the pool, its memory still the graph's (a replay writes there) and no eager allocation's,
and a later capture into the same pool may use it, as CUDA's graphs sharing a pool do (replay them
in the order they were captured). The graph keeps the tensors it did not make (parameters, static
inputs) alive. :meth:`DeviceGraph.reset` (or dropping the graph) lets go of the pool; once no graph
uses it, ``empty_cache`` gives its memory back. On the host, whose tensors are the host's own
memory, the graph keeps every tensor the recorded calls touched until its reset.

**Replay.** Views are not replayed (a view made during capture already shows the memory).
Every other call runs again on host views of its tensors' memory (the device's own storage; on
the host, the tensors themselves) — the device's Python dispatch is skipped — writing a function's
results into the memory its captured outputs occupy. Random operators (torch's
``nondeterministic_seeded`` tag) run again on the device, drawing fresh numbers from the device's
generator at each replay, as a CUDA graph advances its philox offset.

**What a device forbids during capture** is refused with the device runtime's message ("operation
not permitted when stream is capturing"), and the capture is then invalidated as CUDA's is:
reading a value (``.item()``), a copy to the host, synchronising the device. Capturing on the
default stream is refused as CUDA refuses it. ``capture_error_mode`` is CUDA's: under
``"global"`` (the default of ``graph``) a synchronisation in any thread is refused while a
capture is underway; under ``"thread_local"`` and ``"relaxed"`` only the capturing thread's.
"""
from __future__ import annotations

import dataclasses
import itertools
import sys
import threading
import types
from typing import Any, Callable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ...aten.dispatcher import written_args

CAPTURE_ERROR_MODES = ("default", "global", "thread_local", "relaxed")
#: calls that only allocate: their memory is the captured output's, nothing to replay
_ALLOCATIONS = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"})
_pool_ids = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class GraphRuntime:
    """What a device graph asks of its device: ``name`` (``"CUDA"``, ``"NPU"``: the runtime's
    name in its graph class and messages), ``device_type`` (the tensors it records), ``module``
    (the device module: ``Stream``, ``stream``, ``current_stream``, ``default_stream``,
    ``synchronize``, ``empty_cache``) and ``host_view`` (a host tensor on a device tensor's
    memory)."""

    name: str
    device_type: str
    module: Any
    host_view: Callable[[torch.Tensor], torch.Tensor]

    def refusal(self) -> RuntimeError:
        """The device's error for an operation a capture forbids."""
        return _accelerator_error(f"{self.name} error: operation not permitted when stream is capturing")


def _accelerator_error(message: str) -> RuntimeError:
    return getattr(torch, "AcceleratorError", RuntimeError)(message)


@dataclasses.dataclass
class _Capture:
    """A capture underway: its graph, thread, stream and mode."""

    graph: "DeviceGraph"
    thread: int
    stream: Any
    mode: str
    failed: bool = False


_captures: List[_Capture] = []
_captures_lock = threading.Lock()


def check_not_capturing(runtime: GraphRuntime) -> None:
    """Raise the device's refusal when a synchronisation is forbidden here: a capture is underway
    on this thread, or under ``"global"`` mode on any thread (the capture is invalidated)."""
    me = threading.get_ident()
    with _captures_lock:
        found = [c for c in _captures if c.graph.runtime.device_type == runtime.device_type
                 and (c.thread == me or c.mode in ("global", "default"))]
    if found:
        for capture in found:
            capture.failed = True
        raise runtime.refusal()


def is_current_stream_capturing(runtime: GraphRuntime) -> bool:
    """Whether a capture is underway on the calling thread's current stream of the device."""
    with _captures_lock:
        if not _captures:
            return False
        streams = [c.stream for c in _captures if c.graph.runtime.device_type == runtime.device_type]
    return bool(streams) and runtime.module.current_stream() in streams


def _device_allocator(runtime: GraphRuntime) -> Optional[Any]:
    """The caching allocator of the current device where the sim's allocator serves the runtime's
    device type; None on the host (the graph keeps what it touched)."""
    state = sys.modules.get(f"{__package__}.state")
    if state is None or runtime.device_type != state.DEVICE_TYPE:
        return None
    return state.allocator(state.current_device())


class _Recorder(TorchDispatchMode):
    """Records the calls of one capture as replay steps (see the module's docstring), their
    allocations taken from the graph's pool, and refuses what a capture forbids."""

    def __init__(self, capture: _Capture, allocator: Optional[Any], token: Tuple[int, int]):
        super().__init__()
        self.capture = capture
        self.allocator, self.token = allocator, token
        self.steps: List[_Step] = []
        #: storages the capture made (by address), and the saved bytes of those it wrote but did not make
        self.made: set = set()
        self.saved: dict = {}

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        runtime = self.capture.graph.runtime
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        on_device = [x for x in tensors if x.device.type == runtime.device_type]
        if on_device and self._forbidden(func, args, kwargs, runtime):
            self.capture.failed = True
            raise runtime.refusal()
        mutates = bool(written_args(func))
        if mutates:
            self._save_written(func, args, kwargs, runtime)
        if self.allocator is None:
            out = func(*args, **kwargs)
        else:
            with self.allocator.allocating_to(self.token):
                out = func(*args, **kwargs)
        if on_device or any(x.device.type == runtime.device_type for x in _tensors(out)):
            if not mutates and not _is_view(func):
                self.made.update(_address(x) for x in _tensors(out))
            step = self.capture.graph._step(func, args, kwargs, out, self.made)
            if step is not None:
                self.steps.append(step)
        return out

    def _save_written(self, func, args, kwargs, runtime: GraphRuntime) -> None:
        """Save the bytes of every storage of the device that ``func`` writes and the capture
        did not make (before the first write only)."""
        bound = dict(zip((a.name for a in func._schema.arguments), args), **kwargs)
        for name in written_args(func):
            for tensor in _tensors(bound.get(name)):
                key = _address(tensor)
                if tensor.device.type == runtime.device_type and key not in self.made and key not in self.saved:
                    whole = _whole_storage(tensor)
                    self.saved[key] = (whole, whole.clone())

    def restore(self) -> None:
        """Put back the bytes :meth:`_save_written` saved."""
        for whole, copy in self.saved.values():
            whole.copy_(copy)
        self.saved.clear()

    @staticmethod
    def _forbidden(func, args, kwargs, runtime: GraphRuntime) -> bool:
        """Reading a value, or (off the host) a copy to the host."""
        if func is torch.ops.aten._local_scalar_dense.default:
            return True
        if runtime.device_type == "cpu":
            return False
        if func is torch.ops.aten._to_copy.default:
            device = kwargs.get("device")
            return device is not None and torch.device(device).type == "cpu"
        if func.overloadpacket is torch.ops.aten.copy_:
            return args[0].device.type == "cpu"
        return False


def _unowned(view: torch.Tensor) -> torch.Tensor:
    """A host tensor on the memory of host tensor ``view`` that does not keep it alive."""
    storage = view.untyped_storage()
    alias = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), view.device, storage.nbytes())
    return torch.empty(0, dtype=view.dtype).set_(alias, view.storage_offset(), view.size(), view.stride())


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _whole_storage(tensor: torch.Tensor) -> torch.Tensor:
    """A byte tensor over all of ``tensor``'s storage."""
    storage = tensor.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage, 0, (storage.nbytes(),))


def _tensors(value: Any) -> List[torch.Tensor]:
    return [x for x in tree_flatten(value)[0] if isinstance(x, torch.Tensor)]


def _is_view(func) -> bool:
    """Whether ``func`` only makes views (its results alias an input, nothing is written)."""
    schema = func._schema
    return not written_args(func) and bool(schema.returns) and all(
        r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)


class _Step:
    """One recorded call as a replay runs it: ``func`` on ``args``/``kwargs`` (host views, or the
    device tensors for a random operator), its results copied to ``into`` (None: it writes in
    place)."""

    __slots__ = ("func", "args", "kwargs", "into")

    def __init__(self, func, args, kwargs, into):
        self.func, self.args, self.kwargs, self.into = func, args, kwargs, into

    def run(self) -> None:
        result = self.func(*self.args, **self.kwargs)
        if self.into is not None:
            for target, value in zip(self.into, _tensors(result)):
                target.copy_(value)


class DeviceGraph:
    """A graph of one device (the class ``torch.<device>.<TYPE>Graph`` is made from it by
    :func:`graph_class`): ``capture_begin`` / ``capture_end`` record, ``replay`` runs the
    recorded calls again on the same memory, ``reset`` drops them (see the module's docstring).
    ``keep_graph`` is accepted as CUDA's is; there is nothing to instantiate."""

    runtime: GraphRuntime

    def __init__(self, keep_graph: bool = False):
        self._keep_graph = bool(keep_graph)
        self._steps: Optional[List[_Step]] = None
        self._capture: Optional[_Capture] = None
        self._recorder: Optional[_Recorder] = None
        self._pool: Optional[Tuple[int, int]] = None
        #: the device generator's state at ``capture_begin``, put back at ``capture_end``
        self._rng_state: Optional[torch.Tensor] = None
        #: the allocator whose pool ``_pool`` this graph uses, until its reset
        self._pool_allocator: Optional[Any] = None
        self._debug = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global", **_: Any) -> None:
        """Begin capturing on the current stream, which may not be the default one. ``pool``: a
        token of :func:`graph_pool_handle` or another graph's :meth:`pool` (the graphs then
        share it)."""
        name = self.runtime.name
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise RuntimeError(f"Unknown capture error mode. Expected one of {', '.join(CAPTURE_ERROR_MODES)}, "
                               f"got {capture_error_mode!r}")
        if self._capture is not None or self._steps is not None:
            raise RuntimeError(f"This {name}Graph instance already owns a captured graph. To capture a new "
                               "graph, create a new instance or call reset() first.")
        module = self.runtime.module
        stream = module.current_stream()
        if stream == module.default_stream():
            raise RuntimeError(f"{name} graphs must be captured on a non-default stream. (However, after "
                               "capture, it's ok to replay them on the default stream.)")
        self._pool = tuple(pool) if pool is not None else (next(_pool_ids), 0)
        allocator = _device_allocator(self.runtime)
        if allocator is not None:
            allocator.retain_pool(self._pool)
            self._pool_allocator = allocator
        self._rng_state = module.get_rng_state()
        capture = _Capture(self, threading.get_ident(), stream, capture_error_mode)
        with _captures_lock:
            _captures.append(capture)
        self._capture, self._recorder = capture, _Recorder(capture, allocator, self._pool)
        self._recorder.__enter__()

    def capture_end(self) -> None:
        """End the capture; raise the device's error when something it forbade happened."""
        capture, recorder = self._capture, self._recorder
        if capture is None:
            raise RuntimeError(f"{self.runtime.name}Graph::capture_end called without a capture underway")
        recorder.__exit__(None, None, None)
        with _captures_lock:
            _captures.remove(capture)
        self._capture = self._recorder = None
        with torch.no_grad():
            recorder.restore()
        self.runtime.module.set_rng_state(self._rng_state)
        self._rng_state = None
        if capture.failed:
            self._release_pool()
            raise _accelerator_error(f"{self.runtime.name} error: operation failed due to a previous error "
                                     "during capture")
        self._steps = recorder.steps

    def _step(self, func, args, kwargs, out, made: set) -> Optional[_Step]:
        """The replay step of a recorded call (None: a view or an allocation, nothing to run).
        Tensors in ``made`` (storage addresses the capture made) are reached through aliases
        that do not keep them alive when the graph's pool holds their memory."""
        if _is_view(func) or func.overloadpacket.__name__ in _ALLOCATIONS:
            return None
        mutates = bool(written_args(func))
        if torch.Tag.nondeterministic_seeded in func.tags:
            into = None if mutates else _tensors(out)
            return _Step(func, args, kwargs, into)
        device_type, pooled = self.runtime.device_type, self._pool_allocator is not None

        def host(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.device.type == device_type:
                view = self.runtime.host_view(value)
                return _unowned(view) if pooled and _address(value) in made else view
            if isinstance(value, torch.device) and value.type == device_type:
                return torch.device("cpu")
            return value

        into = None if mutates else [host(x) for x in _tensors(out)]
        return _Step(func, tree_map(host, args), tree_map(host, kwargs), into)

    def _release_pool(self) -> None:
        allocator, self._pool_allocator = self._pool_allocator, None
        if allocator is not None:
            allocator.release_pool(self._pool)

    def instantiate(self) -> None:
        """Nothing to do: a captured graph replays as it is."""

    def replay(self) -> None:
        """Run the captured calls again, on the memory of the capture."""
        if self._steps is None:
            raise RuntimeError(f"Called {self.runtime.name}Graph::replay without a preceding successful capture.")
        with torch.no_grad():
            for step in self._steps:
                step.run()

    def reset(self) -> None:
        """Drop the captured calls and let go of the graph's pool (its memory is given back once
        no graph uses the pool); the graph may capture again."""
        if self._capture is not None:
            raise RuntimeError(f"{self.runtime.name}Graph::reset called during a capture")
        self._steps = None
        self._release_pool()

    def __del__(self) -> None:
        if getattr(self, "_pool_allocator", None) is not None and not sys.is_finalizing():
            self._steps = None
            self._release_pool()

    def pool(self) -> Tuple[int, int]:
        """The token of this graph's memory pool (another graph's capture may share it)."""
        if self._pool is None:
            raise RuntimeError(f"{self.runtime.name}Graph::pool called before a capture began")
        return self._pool

    def enable_debug_mode(self) -> None:
        """Keep what :meth:`debug_dump` writes."""
        self._debug = True

    def debug_dump(self, path: str) -> None:
        """Write the replayed calls to ``path``, one operator a line (after :meth:`enable_debug_mode`)."""
        if not self._debug:
            raise RuntimeError(f"{self.runtime.name}Graph::debug_dump: call enable_debug_mode() before capture")
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(f"{step.func}\n" for step in self._steps or ())

    def __repr__(self) -> str:
        state = "captured" if self._steps is not None else "empty"
        return f"<{self.runtime.name}Graph {state}, {len(self._steps or ())} calls>"


def graph_class(runtime: GraphRuntime) -> type:
    """``<NAME>Graph`` of ``runtime``'s device (a :class:`DeviceGraph`), in ``torch.<device>``."""
    module = "torch.cuda" if runtime.name == "CUDA" else f"torch.{runtime.device_type}"
    return type(f"{runtime.name}Graph", (DeviceGraph,), {
        "runtime": runtime, "__doc__": DeviceGraph.__doc__, "__module__": module, "__qualname__": f"{runtime.name}Graph"})


def graph_pool_handle() -> Tuple[int, int]:
    """A token of a new memory pool, which graphs given it share."""
    return (next(_pool_ids), 0)


class GraphAPI:
    """A device's graph functions, as its device module offers them: ``Graph`` (the
    ``<NAME>Graph`` class), ``graph`` (the capturing context manager),
    ``graph_pool_handle``, ``is_current_stream_capturing`` and ``make_graphed_callables``."""

    def __init__(self, runtime: GraphRuntime):
        self.runtime = runtime
        self.Graph = graph_class(runtime)
        self.graph = self._context_class()
        self.graph_pool_handle = graph_pool_handle
        self.make_graphed_callables = self._graphed_callables()

    def is_current_stream_capturing(self) -> bool:
        """Whether a capture is underway on the current stream."""
        return is_current_stream_capturing(self.runtime)

    def _context_class(self) -> type:
        api = self

        class graph:
            """``with graph(g, pool=None, stream=None, capture_error_mode="global"):`` captures
            the block into ``g`` on ``stream`` (default: a side stream shared by every capture),
            after synchronising the device and emptying its cache, as ``torch.cuda.graph``."""

            default_capture_stream = None

            def __init__(self, cuda_graph: Any, pool: Any = None, stream: Any = None,
                         capture_error_mode: str = "global", **_: Any):
                module = api.runtime.module
                if stream is None and type(self).default_capture_stream is None:
                    type(self).default_capture_stream = module.Stream()
                self.pool = () if pool is None else (pool,)
                self.capture_stream = stream if stream is not None else type(self).default_capture_stream
                self.stream_ctx = module.stream(self.capture_stream)
                self.cuda_graph = cuda_graph
                self.capture_error_mode = capture_error_mode

            def __enter__(self) -> None:
                module = api.runtime.module
                module.synchronize()
                module.empty_cache()
                self.stream_ctx.__enter__()
                try:
                    self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
                except BaseException:
                    self.stream_ctx.__exit__(None, None, None)
                    raise

            def __exit__(self, *exc: Any) -> None:
                try:
                    self.cuda_graph.capture_end()
                except RuntimeError:
                    if exc[0] is None:  # else the error that failed the capture propagates
                        raise
                finally:
                    self.stream_ctx.__exit__(*exc)

        return graph

    def _graphed_callables(self) -> Callable:
        """torch's own ``make_graphed_callables``, reading ``torch.cuda`` as this device's graph
        API (its ``CUDAGraph``, ``graph``, streams and synchronisation are the device's)."""
        from torch.cuda import graphs

        original = graphs.make_graphed_callables
        device = _DeviceNamespace(self)
        scope = dict(original.__globals__, torch=_TorchWith(device), graph_pool_handle=graph_pool_handle)
        function = types.FunctionType(original.__code__, scope, original.__name__, original.__defaults__,
                                      original.__closure__)
        function.__kwdefaults__ = original.__kwdefaults__
        function.__doc__ = original.__doc__
        return function


class _DeviceNamespace:
    """``torch.cuda`` as ``make_graphed_callables`` reads it: the device's graph API and module."""

    def __init__(self, api: GraphAPI):
        self._api = api

    def __getattr__(self, name: str) -> Any:
        if name == "CUDAGraph":
            return self._api.Graph
        if name in ("graph", "graph_pool_handle", "make_graphed_callables", "is_current_stream_capturing"):
            return getattr(self._api, name)
        return getattr(self._api.runtime.module, name)


class _TorchWith:
    """``torch`` with ``torch.cuda`` replaced by a device's namespace."""

    def __init__(self, cuda: Any):
        self.cuda = cuda

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)
