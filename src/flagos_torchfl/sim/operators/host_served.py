"""The sim's sparse and quantized dispatch keys, served by the CPU's kernels and registered when
first needed.

A key of the sim (``SparsePrivateUse1``) is served by the kernels of a CPU key
(``SparseCPU``): each overload with a kernel of its own there gets a kernel on the sim's key that
runs it (:mod:`.sparse`, :mod:`.quantized` build them). Registering a few hundred kernels costs
tens of milliseconds, and most programs never make a sparse or quantized tensor, so activation
registers one backend fallback per key instead (:class:`LazyKey`): the first operator that
reaches the key without a kernel of its own registers the key's kernels and is dispatched again.
An overload left without a kernel is refused with the words PyTorch's dispatcher uses for an
operator without a kernel on a key. Only a sparse or quantized sim tensor (or a factory asked for
one) reaches these keys, so the first call that needs a kernel always finds it registered.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Optional

import torch

from ...aten.dispatcher import has_kernel
from ...registrations import keep_at_exit
from ..runtime import state


def refusal(name: str, key: str) -> NotImplementedError:
    """The error PyTorch's dispatcher raises when overload ``name`` has no kernel on ``key``
    (``"SparsePrivateUse1"``), naming the key as the dispatcher does (``Sparsesim``,
    ``Quantizednpu``)."""
    shown = key.replace("PrivateUse1", torch._C._get_privateuse1_backend_name())
    return NotImplementedError(
        f"Could not run '{name}' with arguments from the '{shown}' backend. This could be because the "
        "operator doesn't exist for this backend, or was omitted during the selective/custom build "
        "process (if using custom build).")


def moved(value: Any, device: Optional[torch.device]) -> Any:
    """``value`` with every tensor in it (in lists and tuples too) moved to ``device`` (None: the
    host)."""
    if isinstance(value, torch.Tensor):
        return value.to(device) if device is not None else value.cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(moved(v, device) for v in value)
    return value


def sim_device_of(values) -> Optional[torch.device]:
    """The device of the first sim tensor among ``values`` (in lists and tuples too), or None."""
    for value in values:
        if isinstance(value, torch.Tensor) and value.device.type == state.DEVICE_TYPE:
            return value.device
        if isinstance(value, (list, tuple)):
            found = sim_device_of(value)
            if found is not None:
                return found
    return None


class LazyKey:
    """The kernels of dispatch key ``key``: ``names()`` gives the overloads to serve, and
    ``kernel(name)`` the kernel of one; :meth:`register` registers them all at once,
    :meth:`install` registers a fallback on ``key`` that does so at the first call reaching it."""

    def __init__(self, key: str, names: Callable[[], Iterable[str]], kernel: Callable[[str], Callable]):
        self.key = key
        self.names = names
        self.kernel = kernel
        self._lock = threading.Lock()
        #: the library of the kernels registered at the first call (alive with the fallback,
        #: which holds this object)
        self._library: Optional[torch.library.Library] = None

    def register(self, library: torch.library.Library) -> int:
        """Register the key's kernels through ``library`` (an ``aten`` IMPL library the caller
        keeps alive); returns how many. Overloads that already have a kernel on the key keep it."""
        count = 0
        for name in sorted(self.names()):
            if has_kernel(name, self.key):
                continue
            library.impl(name[len("aten::"):], self.kernel(name), self.key)
            count += 1
        return count

    def install(self, keep_alive: list) -> None:
        """Register the fallback on the key; its library goes to ``keep_alive``."""
        fallback = keep_at_exit(torch.library.Library("_", "IMPL"))
        fallback.fallback(self._first_call, self.key, with_keyset=True)
        keep_alive.append(fallback)

    def _first_call(self, keyset, op, *args, **kwargs):
        name = op.name()
        with self._lock:
            if self._library is None:
                library = keep_at_exit(torch.library.Library("aten", "IMPL"))
                self.register(library)
                self._library = library
        if not has_kernel(name, self.key):
            raise refusal(name, self.key)
        return op.redispatch(keyset, *args, **kwargs)
