"""Collectives for the simulated accelerator: gloo behind a host-memory staging layer.

:func:`register` does two things:

1. It registers a process-group backend ``name`` for the sim's device type with
   ``torch.distributed.Backend.register_backend(name, creator, extended_api=True,
   devices=[device_type])``. Its creator returns a ``ProcessGroupGloo`` built on the store, rank
   and world size torch hands it (the store prefixed with ``name``), so
   ``init_process_group("cpu:gloo,sim:NAME")`` or ``init_process_group("NAME")`` gives a process
   group whose backend for the sim device is a gloo instance of its own.
2. It replaces the PrivateUse1 kernels of the ``c10d::`` collective operators (``allreduce_``,
   ``broadcast_``, ``_allgather_base_`` ... 19 of them, :data:`STAGED_OPS`). Every collective on
   a sim tensor reaches one of them, whoever starts it: ``torch.distributed``'s Python functions,
   DDP's C++ reducer, the functional collectives of DTensor and FSDP2, DCP's object collectives.
   The kernel copies the sim inputs to host buffers, runs the same collective on the group's
   sim-device backend with those buffers, and copies the results back into the sim tensors in
   place when the backend's work completes.

Why not a Python ``dist.ProcessGroup`` subclass (the ``test_c10d_pypg`` style)? On torch 2.13 a
Python class can subclass ``ProcessGroup`` only, not ``Backend`` (``Backend`` has no Python
constructor), and torch's ``_new_process_group_helper`` then makes that object the whole group,
dropping any other backend named in ``"cpu:gloo,sim:NAME"``. Its C++ trampoline forwards only
some virtual methods (``allreduce``, ``allgather``, ``broadcast``, ``barrier``, ``send``...) but
not ``all_gather_single``, ``reduce_scatter_single``, ``gather``, ``scatter``, ``reduce`` or
``alltoall``: C++ callers of those (functional collectives, used by DTensor) fall through to the
base class, which dispatches to the ``c10d::`` operators and looks for a ``Backend`` registered
for the device: "No backend type associated with device type". Putting the staging in those
operators' PrivateUse1 kernels covers every caller and leaves the group an ordinary
``ProcessGroup`` with ordinary backends.

Work handles: each kernel returns a work whose future a helper thread completes once gloo's
work has and the results are copied back, so ``wait()``,
``is_completed()`` and ``get_future()`` behave as on a device backend, and the future's value is
the gloo future's value with every host buffer replaced by the sim tensor it was staged for
(``[tensor]`` for an all-reduce: what DDP comm hooks expect). Point-to-point works have no
future in gloo: ``send`` returns gloo's work (its host buffer needs no copy back), ``recv``
completes its future from a helper thread that waits on gloo, and ``recv_anysource`` waits before
returning (its caller asks the work for the source rank, which only gloo's work knows). At exit
the helpers still running are waited for (:func:`join_helpers`, at most 5 s).

Reductions: ``AVG`` runs as ``SUM`` followed by a division of the host result by the group size
(bit-identical to gloo's own ``AVG`` where it has one; integer tensors fail as in gloo).
``PREMUL_SUM`` (NCCL has it, gloo and HCCL do not) reaches these kernels without its factor
(the ``c10d`` operator hands over the reduce op alone), so it is refused here with a clear
error; under activation the sim's ``torch.distributed.all_reduce`` and reduce-scatters run it
before it gets here, as a multiply and a SUM (the ``premul_sum``
patch), except under a profile of a chip whose library lacks it (Ascend's HCCL).

Limits: ``monitored_barrier`` is refused by torch itself for any group whose backend is not
plain ``"gloo"`` ("monitored_barrier is only implemented for GLOO backend"), so it is not
available with these groups, as with NCCL. Sparse all-reduce is refused (the sim has no sparse
tensors). A finite ``timeout`` passed to ``Work.wait`` is ignored: the group's timeout applies
(gloo fails the collective, and the wait raises). The replaced kernels serve the whole
PrivateUse1 key, which is why :func:`register` refuses unless the sim holds it.

Every byte copied between a sim tensor and a host buffer is counted (:func:`stats`,
:func:`bytes_staged`, :func:`reset`).
"""
from __future__ import annotations

import atexit
import datetime
import threading
import time
import warnings
from typing import Any, Callable, Sequence

import torch

from ...errors import ConfigError
from ...registrations import keep_at_exit
from ..runtime.tensors import host_view

__all__ = ["register", "registered", "bytes_staged", "stats", "reset", "STAGED_OPS"]

_BUILTIN_NAMES = ("gloo", "nccl", "mpi", "ucc", "xccl", "fake", "undefined", "threaded")

_lock = threading.Lock()
_counts = {"to_host_bytes": 0, "to_device_bytes": 0, "collectives": 0}
_state: dict[str, Any] = {"device_type": None, "library": None, "names": set()}


# -- counting -------------------------------------------------------------------------------
def stats() -> dict[str, int]:
    """Bytes copied from sim tensors to host buffers (``to_host_bytes``) and back
    (``to_device_bytes``), and the number of collectives staged, since start or :func:`reset`."""
    with _lock:
        return dict(_counts)


def bytes_staged() -> int:
    """Host bytes the staged collectives moved, both directions together."""
    with _lock:
        return _counts["to_host_bytes"] + _counts["to_device_bytes"]


def reset() -> None:
    """Zero the counters of :func:`stats`."""
    with _lock:
        for key in _counts:
            _counts[key] = 0


def _count(key: str, nbytes: int) -> None:
    with _lock:
        _counts[key] += nbytes


# -- helper threads -------------------------------------------------------------------------
#: helper threads still waiting on gloo or copying back
_helpers: set = set()
#: seconds the exit handler waits at most for the helpers
HELPERS_LIMIT_S = 5.0


def _start_helper(target: Callable[[], None]) -> None:
    """Run ``target`` on a daemon helper thread that :func:`join_helpers` can wait for."""

    def run() -> None:
        try:
            target()
        finally:
            with _lock:
                _helpers.discard(thread)

    thread = threading.Thread(target=run, name="sim-collective-wait", daemon=True)
    with _lock:
        _helpers.add(thread)
    thread.start()


def join_helpers(limit_s: float = HELPERS_LIMIT_S) -> bool:
    """Wait (the GIL released) until every helper thread has ended, at most ``limit_s`` seconds in
    all; True when none is left. Run at exit: a helper still inside gloo's ``wait()`` when the
    interpreter finalizes would be ended there, in C++, and abort the process."""
    deadline = time.monotonic() + limit_s
    while True:
        with _lock:
            alive = list(_helpers)
        if not alive:
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        alive[0].join(left)


atexit.register(join_helpers)


# -- registration ---------------------------------------------------------------------------
def registered() -> tuple[str | None, frozenset[str]]:
    """``(device_type, names)``: the device type whose collectives are staged (None before
    :func:`register`) and the backend names registered for it."""
    with _lock:
        return _state["device_type"], frozenset(_state["names"])


def register(device_type: str, name: str) -> None:
    """Give device type ``device_type`` (the sim's, which must hold PyTorch's PrivateUse1 slot)
    collectives: stage its tensors through host memory in every ``c10d::`` collective
    operator, and register process-group backend ``name`` (e.g. ``"simccl"``, ``"hccl"``) whose
    instance for ``device_type`` is a gloo group of its own. Idempotent; more names may be
    registered for the same device type. Raises :class:`~flagos_torchfl.errors.ConfigError` for
    a name torch already uses or one that cannot appear in a backend string, for a device type
    that is not the sim's, or for a second device type in one process.

    ``torch.distributed.Backend.default_device_backend_map[device_type]`` becomes ``name``
    unless the map already names a backend for ``device_type`` (torch's rule)."""
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError("torch.distributed is not available in this PyTorch build")
    name = _check_name(name)
    with _lock:
        if _state["device_type"] not in (None, device_type):
            raise ConfigError(
                f"sim collectives are already registered for device type {_state['device_type']!r}; "
                f"the PrivateUse1 slot has one device type per process, not also {device_type!r}")
    _check_device_type(device_type)
    with _lock:
        if _state["library"] is None:
            _state["library"] = _register_kernels()
            _state["device_type"] = device_type
        if name in _state["names"]:
            return
        dist.Backend.register_backend(name, _create_backend, extended_api=True, devices=[device_type])
        _state["names"].add(name)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"the collective backend name must be a non-empty string, got {name!r}")
    name = name.strip().lower()
    if any(c in name for c in ":, /"):
        raise ConfigError(f"the collective backend name {name!r} cannot contain ':', ',', '/' or spaces "
                          "(it appears in backend strings such as 'cpu:gloo,sim:NAME')")
    if name in _BUILTIN_NAMES:
        raise ConfigError(f"the collective backend name {name!r} is one of torch's own "
                          f"({', '.join(_BUILTIN_NAMES)}); choose another, e.g. 'simccl' or 'hccl'")
    return name


def _check_device_type(device_type: object) -> None:
    from .. import is_installed

    owner = torch._C._get_privateuse1_backend_name()
    if not isinstance(device_type, str) or device_type != owner or not is_installed():
        raise ConfigError(
            f"sim collectives need the sim installed as device type {device_type!r} on PrivateUse1; "
            f"PrivateUse1 is {owner!r} and the sim is "
            f"{'installed' if is_installed() else 'not installed (call flagos_torchfl.sim.install())'}")


def _create_backend(common_opts: Any, backend_opts: Any) -> Any:
    """The backend torch asks for when a group names ours for the sim device: a gloo group of
    its own on the store torch prefixed for this group and device (prefixed once more), with
    torch's timeout. ``backend_opts`` (the ``pg_options`` of ``init_process_group``, meant for
    another library) is not used."""
    from torch.distributed import PrefixStore, ProcessGroupGloo

    store = PrefixStore("staged/", common_opts.store)
    backend = ProcessGroupGloo(store, common_opts.group_rank, common_opts.group_size,
                               common_opts.timeout)
    backend.options.global_ranks_in_group = list(common_opts.global_ranks_in_group)
    backend.options.group_name = common_opts.group_id
    return backend


def _register_kernels() -> torch.library.Library:
    library = keep_at_exit(torch.library.Library("c10d", "IMPL"))
    with warnings.catch_warnings():
        # torch warns that a kernel replaces the PrivateUse1 one from c10d's Ops.cpp: intended.
        warnings.simplefilter("ignore")
        for op_name, kernel in _KERNELS.items():
            library.impl(op_name, kernel, "PrivateUse1")
    return library


# -- staging --------------------------------------------------------------------------------
def _c10d():
    return torch._C._distributed_c10d


def _to_host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous host copy of ``t`` (``t`` itself when it is already a CPU tensor)."""
    if t.device.type == "cpu":
        return t
    host = t.detach().to("cpu").contiguous()
    _count("to_host_bytes", host.nbytes)
    return host


def _host_buffer(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised contiguous host tensor shaped like ``t`` (``t`` itself on the CPU)."""
    if t.device.type == "cpu":
        return t
    return torch.empty(t.shape, dtype=t.dtype)


def _write_back(pairs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for device_tensor, host in pairs:
        if host is not device_tensor:
            device_tensor.copy_(host)
            _count("to_device_bytes", host.nbytes)


class _Staging:
    """The host side of one collective: host buffers for its sim tensors, and what to copy
    back into which sim tensor once the collective completes."""

    def __init__(self, device_tensors: Sequence[torch.Tensor]):
        self.device = next((t.device for t in device_tensors if t.device.type != "cpu"), None)
        if self.device is None:
            raise RuntimeError("staged collective called without a sim tensor")
        self.back: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.of_host: dict[int, torch.Tensor] = {}
        self.divisor = 1
        self.inference = torch.is_inference_mode_enabled()
        _count("collectives", 1)

    def send(self, t: torch.Tensor) -> torch.Tensor:
        """A host copy of input ``t``."""
        host = _to_host(t)
        self.of_host[id(host)] = t
        return host

    def inout(self, t: torch.Tensor) -> torch.Tensor:
        """A host copy of ``t`` whose result is copied back into ``t``."""
        host = self.send(t)
        self.back.append((t, host))
        return host

    def out(self, t: torch.Tensor) -> torch.Tensor:
        """A host buffer for output ``t``, copied back into ``t``."""
        host = _host_buffer(t)
        self.of_host[id(host)] = t
        self.back.append((t, host))
        return host

    def finish(self) -> None:
        """Copy the results back (after dividing them for an emulated AVG). It runs on a helper
        thread, where the caller's inference mode (thread-local) is not: it is restored, since
        tensors made under it can be written only under it (Ultralytics reduces its validation
        losses inside ``torch.inference_mode()``), and the results are written below autograd,
        as a chip's collective library writes device memory."""
        with torch.inference_mode(self.inference), torch.no_grad():
            if self.divisor != 1:
                for _, host in self.back:
                    host.div_(self.divisor)
            _write_back(self.back)

    def as_device(self, value: Any) -> Any:
        """``value`` (a gloo future's result) with host buffers replaced by their sim tensors."""
        if isinstance(value, torch.Tensor):
            return self.of_host.get(id(value), value)
        if isinstance(value, (list, tuple)):
            return type(value)(self.as_device(v) for v in value)
        return value

    def backend(self, process_group: Any) -> Any:
        """The backend ``process_group`` registered for the sim device."""
        group = _c10d().ProcessGroup.unbox(process_group)
        try:
            return group._get_backend(self.device)
        except RuntimeError as exc:
            raise RuntimeError(
                f"{exc}. The process group has no collective backend for {self.device.type} "
                f"tensors: create it with a backend for them, e.g. "
                f"init_process_group('cpu:gloo,{self.device.type}:NAME') with a name passed to "
                f"flagos_torchfl.sim.integration.collectives.register()") from None

    def reduce_op(self, reduce_op: Any, size: int) -> Any:
        """The reduce op to hand to gloo for ``reduce_op`` (a ``c10d.ReduceOp`` script object),
        arranging the division when AVG is emulated."""
        c10d = _c10d()
        kind = c10d.ReduceOp.RedOpType(reduce_op.op())
        if kind == c10d.ReduceOp.RedOpType.PREMUL_SUM:
            names = ", ".join(sorted(_state["names"])) or "the sim's collectives"
            raise ValueError(
                f"ReduceOp.PREMUL_SUM is not supported by {names} on {self.device.type} "
                "tensors (a collective library without PREMUL_SUM, as gloo and HCCL; with "
                "flagos_torchfl activated on the plain sim, torch.distributed's all_reduce and "
                "reduce-scatters take it): use ReduceOp.SUM and scale the tensor")
        if kind == c10d.ReduceOp.RedOpType.AVG:
            self.divisor = size
            kind = c10d.ReduceOp.RedOpType.SUM
        return c10d.ReduceOp(kind)

    def complete(self, works: Sequence[Any]) -> Any:
        """A work that completes when every gloo work in ``works`` has and the results are
        copied back. Its future's value is the (last) gloo future's value in sim tensors; for
        gloo works without a future (point-to-point, list reduce-scatter) it is the list of
        sim outputs.

        A helper thread waits on gloo and copies back. No Python callback is chained on gloo's
        futures: gloo completes them on its worker thread, which would then need the GIL, and a
        process group destroyed while the GIL is held (a DDP reducer freed at exit) joins that
        thread: a deadlock."""
        try:
            futures = [w.get_future() for w in works]
        except RuntimeError:  # "Work::getFuture not implemented"
            futures = None
        future: torch.futures.Future = torch.futures.Future()

        def wait() -> None:
            try:
                if futures is None:
                    for work in works:
                        work.wait()
                    value = [t for t, _ in self.back]
                else:
                    for gloo_future in futures:
                        gloo_future.wait()  # releases the GIL while it waits
                    value = futures[-1].value()
                self.finish()
                value = self.as_device(value)
            except BaseException as exc:  # handed to whoever waits on the work
                future.set_exception(exc)
                return
            future.set_result(value)

        _start_helper(wait)
        return _StagedWork(future)


class _StagedWork(torch._C._distributed_c10d.Work if torch.distributed.is_available() else object):
    """The work of a staged collective: complete once the results are back in the sim tensors.

    A Python subclass of torch's ``Work`` (torch's trampoline forwards ``wait`` and
    ``get_future`` from C++ to it), not ``_create_work_from_future``: that work's ``wait()``
    returns True even when its future failed, which would hide a failed collective. Torch's C++
    holds the work without holding this Python object, so it is kept in :data:`_live` until it
    was waited on, or its future was handed out and has completed (what C++ callers do: DDP's
    reducer takes the future, functional collectives wait once)."""

    def __init__(self, future: torch.futures.Future):
        super().__init__()
        self._future = future
        with _lock:
            _live.add(self)

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Block until the results are in the sim tensors; raise the collective's error.
        ``timeout`` is ignored: the group's timeout applies."""
        try:
            self._future.wait()
        finally:
            self._release()
        return True

    def get_future(self) -> torch.futures.Future:
        """A future completed with the output sim tensors (or the collective's error)."""
        self._future.add_done_callback(lambda _: self._release())
        return self._future

    def is_completed(self) -> bool:
        """True once the results are in the sim tensors (or the collective failed)."""
        return self._future.done()

    def is_success(self) -> bool:
        """True once the collective completed without error."""
        if not self._future.done():
            return False
        try:
            self._future.value()
        except Exception:  # noqa: BLE001 - a failed collective
            return False
        return True

    def _release(self) -> None:
        with _lock:
            _live.discard(self)


_live: set[_StagedWork] = set()


def _options(cls_name: str, async_op: bool | None = None, timeout: int = -1, **fields: Any) -> Any:
    opts = getattr(_c10d(), cls_name)()
    if async_op is not None:
        opts.asyncOp = async_op
    if timeout is not None and timeout >= 0:
        opts.timeout = datetime.timedelta(milliseconds=timeout)
    for key, value in fields.items():
        setattr(opts, key, value)
    return opts


def _flat(nested: Sequence[Sequence[torch.Tensor]]) -> list[torch.Tensor]:
    return [t for group in nested for t in group]


def _check_dense(tensors: Sequence[torch.Tensor]) -> None:
    for t in tensors:
        if t.layout != torch.strided:
            raise RuntimeError(f"sim collectives take dense (strided) tensors, got layout {t.layout}")


# -- the c10d:: kernels ----------------------------------------------------------------------
# Signatures follow the operators' schemas (torch.ops.c10d.<name>.default._schema); arguments
# with a schema default arrive only when the caller passed them, hence the defaults here.
def _allreduce(tensors, process_group, reduce_op, sparse_indices=None, async_op=True, timeout=-1):
    if sparse_indices is not None:
        raise RuntimeError("sparse all_reduce is not supported on the sim (it has no sparse tensors)")
    _check_dense(tensors)
    s = _Staging(tensors)
    backend = s.backend(process_group)
    opts = _options("AllreduceOptions", async_op, timeout,
                    reduceOp=s.reduce_op(reduce_op, backend.size()))
    work = backend.allreduce([s.inout(t) for t in tensors], opts)
    return tensors, s.complete([work]).boxed()


def _allreduce_coalesced(tensors, process_group, reduce_op, async_op=True, timeout=-1):
    _check_dense(tensors)
    s = _Staging(tensors)
    backend = s.backend(process_group)
    opts = _options("AllreduceCoalescedOptions", async_op, timeout,
                    reduceOp=s.reduce_op(reduce_op, backend.size()))
    work = backend.allreduce_coalesced([s.inout(t) for t in tensors], opts)
    return s.complete([work]).boxed()


def _broadcast(tensors, process_group, root_rank, root_tensor, async_op=True, timeout=-1):
    s = _Staging(tensors)
    backend = s.backend(process_group)
    opts = _options("BroadcastOptions", async_op, timeout, rootRank=root_rank, rootTensor=root_tensor)
    work = backend.broadcast([s.inout(t) for t in tensors], opts)
    return tensors, s.complete([work]).boxed()


def _allgather(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    s = _Staging(list(input_tensors) + _flat(output_tensors))
    backend = s.backend(process_group)
    outputs = [[s.out(t) for t in group] for group in output_tensors]
    work = backend.allgather(outputs, [s.send(t) for t in input_tensors],
                             _options("AllgatherOptions", async_op, timeout))
    return output_tensors, s.complete([work]).boxed()


def _allgather_base(output_tensor, input_tensor, process_group, async_op=True, timeout=-1):
    s = _Staging([input_tensor, output_tensor])
    backend = s.backend(process_group)
    work = backend._allgather_base(s.out(output_tensor), s.send(input_tensor),
                                   _options("AllgatherOptions", async_op, timeout))
    return output_tensor, s.complete([work]).boxed()


def _allgather_coalesced(output_lists, input_list, process_group, async_op=True):
    s = _Staging(list(input_list) + _flat(output_lists))
    backend = s.backend(process_group)
    outputs = [[s.out(t) for t in group] for group in output_lists]
    work = backend.allgather_coalesced(outputs, [s.send(t) for t in input_list],
                                       _options("AllgatherOptions", async_op))
    return s.complete([work]).boxed()


def _allgather_into_tensor_coalesced(outputs, inputs, process_group, async_op=True):
    # gloo's Python binding has no coalesced form: one _allgather_base per pair, one work.
    s = _Staging(list(inputs) + list(outputs))
    backend = s.backend(process_group)
    works = [backend._allgather_base(s.out(o), s.send(i), _options("AllgatherOptions", async_op))
             for o, i in zip(outputs, inputs)]
    return s.complete(works).boxed()


def _reduce_scatter(output_tensors, input_tensors, process_group, reduce_op, async_op=True,
                    timeout=-1):
    s = _Staging(list(output_tensors) + _flat(input_tensors))
    backend = s.backend(process_group)
    opts = _options("ReduceScatterOptions", async_op, timeout,
                    reduceOp=s.reduce_op(reduce_op, backend.size()))
    work = backend.reduce_scatter([s.out(t) for t in output_tensors],
                                  [[s.send(t) for t in group] for group in input_tensors], opts)
    return output_tensors, s.complete([work]).boxed()


def _reduce_scatter_base(output_tensor, input_tensor, process_group, reduce_op, async_op=True,
                         timeout=-1):
    s = _Staging([output_tensor, input_tensor])
    backend = s.backend(process_group)
    opts = _options("ReduceScatterOptions", async_op, timeout,
                    reduceOp=s.reduce_op(reduce_op, backend.size()))
    work = backend._reduce_scatter_base(s.out(output_tensor), s.send(input_tensor), opts)
    return output_tensor, s.complete([work]).boxed()


def _reduce_scatter_tensor_coalesced(outputs, inputs, process_group, reduce_op, async_op=True,
                                     timeout=-1):
    s = _Staging(list(outputs) + list(inputs))
    backend = s.backend(process_group)
    op = s.reduce_op(reduce_op, backend.size())
    works = [backend._reduce_scatter_base(
                 s.out(o), s.send(i), _options("ReduceScatterOptions", async_op, timeout, reduceOp=op))
             for o, i in zip(outputs, inputs)]
    return s.complete(works).boxed()


def _alltoall(output_tensors, input_tensors, process_group, async_op=True, timeout=-1):
    s = _Staging(list(output_tensors) + list(input_tensors))
    backend = s.backend(process_group)
    work = backend.alltoall([s.out(t) for t in output_tensors], [s.send(t) for t in input_tensors],
                            _options("AllToAllOptions", async_op, timeout))
    return output_tensors, s.complete([work]).boxed()


def _alltoall_base(output, input, process_group, output_split_sizes, input_split_sizes,
                   async_op=True, timeout=-1):
    s = _Staging([output, input])
    backend = s.backend(process_group)
    work = backend.alltoall_base(s.out(output), s.send(input), list(output_split_sizes),
                                 list(input_split_sizes), _options("AllToAllOptions", async_op, timeout))
    return s.complete([work]).boxed()


def _gather(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    s = _Staging(list(input_tensors) + _flat(output_tensors))
    backend = s.backend(process_group)
    outputs = [[s.out(t) for t in group] for group in output_tensors]
    work = backend.gather(outputs, [s.send(t) for t in input_tensors],
                          _options("GatherOptions", async_op, timeout, rootRank=root_rank))
    return s.complete([work]).boxed()


def _scatter(output_tensors, input_tensors, process_group, root_rank, async_op=True, timeout=-1):
    s = _Staging(list(output_tensors) + _flat(input_tensors))
    backend = s.backend(process_group)
    inputs = [[s.send(t) for t in group] for group in input_tensors]
    work = backend.scatter([s.out(t) for t in output_tensors], inputs,
                           _options("ScatterOptions", async_op, timeout, rootRank=root_rank))
    return output_tensors, s.complete([work]).boxed()


def _reduce(tensors, process_group, reduce_op, root_rank, root_tensor, async_op=True, timeout=-1):
    s = _Staging(tensors)
    backend = s.backend(process_group)
    opts = _options("ReduceOptions", async_op, timeout, reduceOp=s.reduce_op(reduce_op, backend.size()),
                    rootRank=root_rank, rootTensor=root_tensor)
    work = backend.reduce([s.inout(t) for t in tensors], opts)
    return s.complete([work]).boxed()


def _barrier(tensor, process_group, device_ids, async_op=True, timeout=-1):
    s = _Staging([tensor])
    backend = s.backend(process_group)
    work = backend.barrier(_options("BarrierOptions", async_op, timeout, device_ids=list(device_ids)))
    return s.complete([work]).boxed()


def _send(tensors, process_group, dst, tag):
    s = _Staging(tensors)
    return s.backend(process_group).send([s.send(t) for t in tensors], dst, tag).boxed()


def _recv(tensors, process_group, src, tag):
    s = _Staging(tensors)
    backend = s.backend(process_group)
    return s.complete([backend.recv([s.out(t) for t in tensors], src, tag)]).boxed()


def _recv_any_source(tensors, process_group, tag):
    # torch asks the returned work for the sender's rank, which only gloo's work knows, and a
    # gloo receive cannot be waited on twice: so gloo receives straight into the sim tensors'
    # bytes (host memory, through host views) and its work is returned as it is.
    s = _Staging(tensors)
    backend = s.backend(process_group)
    views = []
    for t in tensors:
        if t.device.type == "cpu":
            views.append(t)
            continue
        if not t.is_contiguous():
            raise RuntimeError("receiving from any source needs a contiguous sim tensor")
        views.append(host_view(t))
        _count("to_device_bytes", t.nbytes)
    return backend.recv_anysource(views, tag).boxed()


_KERNELS: dict[str, Callable[..., Any]] = {
    "allreduce_": _allreduce,
    "allreduce_coalesced_": _allreduce_coalesced,
    "broadcast_": _broadcast,
    "allgather_": _allgather,
    "_allgather_base_": _allgather_base,
    "allgather_coalesced_": _allgather_coalesced,
    "allgather_into_tensor_coalesced_": _allgather_into_tensor_coalesced,
    "reduce_scatter_": _reduce_scatter,
    "_reduce_scatter_base_": _reduce_scatter_base,
    "reduce_scatter_tensor_coalesced_": _reduce_scatter_tensor_coalesced,
    "alltoall_": _alltoall,
    "alltoall_base_": _alltoall_base,
    "gather_": _gather,
    "scatter_": _scatter,
    "reduce_": _reduce,
    "barrier": _barrier,
    "send": _send,
    "recv_": _recv,
    "recv_any_source_": _recv_any_source,
}

STAGED_OPS: tuple[str, ...] = tuple(f"c10d::{name}" for name in _KERNELS)
"""The ``c10d::`` operators whose PrivateUse1 kernels :func:`register` replaces."""
