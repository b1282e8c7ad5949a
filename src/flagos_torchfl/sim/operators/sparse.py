"""Sparse tensors on the sim (COO and the compressed layouts), as CUDA has them.

A sparse sim tensor is PyTorch's own sparse tensor whose indices and values are dense sim
tensors. The sim's memory is host memory, so the CPU's sparse kernels serve it: every overload
with a kernel on ``SparseCPU`` (``SparseCsrCPU``) gets a ``SparsePrivateUse1``
(``SparseCsrPrivateUse1``) kernel that calls that CPU kernel on the sim tensors themselves; the
tensors it makes take their device from the arguments, and the dense operators it calls on the
indices and values dispatch to the sim. The overloads are read from the dispatcher, not listed,
and registered at the first call that needs one (:mod:`.host_served`).
A CPU kernel that insists on CPU operands (``addmm``'s "expected 't' to be CPU tensor") or calls a
per-device routine that has no entry for the sim (``_coalesce``, ``relu``: "DispatchStub: missing
kernel") runs on host copies instead, its result copied back to the device.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...aten.dispatcher import overload, with_kernel, written_args
from .host_served import LazyKey, moved, sim_device_of

#: the sim's sparse dispatch keys and the CPU keys whose kernels serve them
KEYS = {"SparsePrivateUse1": "SparseCPU", "SparseCsrPrivateUse1": "SparseCsrCPU"}
_NUMBERS = (bool, int, float, complex)


def overloads(cpu_key: str) -> list[str]:
    """The ``aten`` overloads with a kernel of their own on ``cpu_key``, sorted."""
    return sorted(with_kernel(cpu_key))


def _needs_host(exc: RuntimeError) -> bool:
    """Whether a CPU kernel refused the sim's tensors themselves: it wants CPU operands, or a
    per-device routine it calls (a DispatchStub) has no entry for the sim's device type."""
    return "CPU" in str(exc) or "DispatchStub: missing kernel for" in str(exc)


def _kernel(op, cpu_key: str) -> Callable:
    kernel = torch.library.get_kernel(op, cpu_key)
    keyset = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, cpu_key))
    tensor_params = {i for i, a in enumerate(op._schema.arguments)
                     if not a.kwarg_only and str(a.type) in ("Tensor", "Optional[Tensor]")}
    writes = bool(written_args(op))

    def run(*args, **kwargs):
        # a wrapped-number argument (``s * 2``) reaches a Python kernel as a number
        args = tuple(torch.tensor(a) if i in tensor_params and isinstance(a, _NUMBERS) else a
                     for i, a in enumerate(args))
        try:
            return kernel.call_boxed(keyset, *args, **kwargs)
        except RuntimeError as exc:
            if writes or not _needs_host(exc):
                raise
        device = sim_device_of((*args, *kwargs.values()))
        result = op(*moved(args, None), **{k: moved(v, None) for k, v in kwargs.items()})
        return moved(result, device)

    run.__name__ = run.__qualname__ = f"sim_sparse_{op.name().replace('::', '_').replace('.', '_')}"
    return run


def lazy_keys(served: Callable[[str, str], bool] | None = None) -> list[LazyKey]:
    """The sim's sparse keys, each served by its CPU key's kernels (:class:`~.host_served.LazyKey`);
    ``served(key, name)``, when given, keeps only the overloads it accepts."""
    def names(key: str, cpu_key: str) -> Callable[[], list[str]]:
        return lambda: [n for n in overloads(cpu_key) if served is None or served(key, n)]

    def kernel(cpu_key: str) -> Callable[[str], Callable]:
        return lambda name: _kernel(overload(name), cpu_key)

    return [LazyKey(key, names(key, cpu_key), kernel(cpu_key)) for key, cpu_key in KEYS.items()]


def register(library: torch.library.Library) -> int:
    """Register every sparse kernel of the sim through ``library`` (an ``aten`` IMPL library the
    caller keeps alive) at once; returns how many. Overloads the sim already has a sparse kernel
    for keep it."""
    return sum(key.register(library) for key in lazy_keys())
