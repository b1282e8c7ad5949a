"""Questions to PyTorch's dispatcher about operators and a dispatch key: which ATen overloads a
key has natively, which decompose before any backend sees them, which need a backend kernel."""
from __future__ import annotations

import functools
from typing import FrozenSet, Iterable, Tuple

import torch

from ..backends.coverage import native_ops

_has = torch._C._dispatch_has_kernel_for_dispatch_key


def native_set(dispatch_key: str) -> FrozenSet[str]:
    """ATen overloads with a kernel registered for ``dispatch_key`` right now."""
    return frozenset(native_ops(dispatch_key))


@functools.lru_cache(maxsize=None)
def all_aten() -> Tuple[str, ...]:
    """Every ATen overload this torch has."""
    return tuple(sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")))


def is_implicit(name: str) -> bool:
    """True for CompositeImplicitAutograd overloads: they decompose before reaching any backend
    (a backend kernel for one would hide the decomposition from autograd)."""
    return _has(name, "CompositeImplicitAutograd")


def is_explicit_composite(name: str) -> bool:
    """True when a CompositeExplicitAutograd(NonFunctional) kernel serves every backend."""
    return _has(name, "CompositeExplicitAutograd") or _has(name, "CompositeExplicitAutogradNonFunctional")


@functools.lru_cache(maxsize=1)
def stub_composites() -> FrozenSet[str]:
    """Overloads whose composite kernel only raises ("..._overrideable": PrivateUse1's
    convolution and fused attention arrive under these names)."""
    return frozenset(n for n in all_aten() if "_overrideable" in n)


def needs_backend_kernel(name: str) -> bool:
    """True when a call of ``name`` reaches the backend's own kernel (or its fallback)."""
    if is_implicit(name):
        return False
    if name in stub_composites():
        return True
    return not is_explicit_composite(name)


def routable(native: Iterable[str]) -> Tuple[str, ...]:
    """Overloads that reach the backend and are not in ``native``: what routing serves."""
    have = frozenset(native)
    return tuple(n for n in all_aten() if n not in have and needs_backend_kernel(n))


def has_backend_fallback(dispatch_key: str) -> bool:
    """True when something (a vendor plugin, or this package) holds the key's one fallback."""
    return torch._C._dispatch_has_backend_fallback(getattr(torch._C.DispatchKey, dispatch_key))
