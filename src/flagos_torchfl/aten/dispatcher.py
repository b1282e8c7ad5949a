"""Questions to PyTorch's dispatcher about ATen operators and a dispatch key: which overloads
exist, which a key has natively, which decompose before any backend sees them, which need a
backend kernel. Answers are read at run time, never kept as constants."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from typing import Callable, Dict, FrozenSet, Iterable, Optional, Tuple

import torch

PREFIX = "aten::"
_has = torch._C._dispatch_has_kernel_for_dispatch_key


@functools.lru_cache(maxsize=None)
def all_aten() -> Tuple[str, ...]:
    """Every ATen overload this torch has, by dispatcher name (``"aten::add.Tensor"``,
    ``"aten::relu"`` for a default overload)."""
    return tuple(sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith(PREFIX)))


@functools.lru_cache(maxsize=1)
def overloads_by_packet() -> Dict[str, Tuple[str, ...]]:
    """``"add"`` -> every overload of ``aten::add`` this torch has, fully qualified."""
    packets: Dict[str, list] = {}
    for name in all_aten():
        packets.setdefault(name[len(PREFIX):].partition(".")[0], []).append(name)
    return {k: tuple(sorted(v)) for k, v in packets.items()}


def overload(name: str) -> torch._ops.OpOverload:
    """The OpOverload for a dispatcher name (``"aten::add.Tensor"``, ``"aten::relu"``)."""
    namespace, _, rest = name.partition("::")
    packet, _, overload_name = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload_name or "default")


@functools.lru_cache(maxsize=None)
def written_args(op: "torch._ops.OpOverload") -> Tuple[str, ...]:
    """Names of the arguments operator ``op`` writes to (``self`` of ``add_``, ``out`` ...), in
    schema order."""
    return tuple(a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write)


def schema_of(name: str) -> torch._C.FunctionSchema:
    """The schema of overload ``name``, read from the dispatcher without building its Python
    packet (``torch.ops.aten.<packet>``), which costs a hundred times more."""
    packet, _, overload_name = name.partition(".")
    return torch._C._get_schema(packet, overload_name)


CACHED_TAGS = ("core", "nondeterministic_seeded", "view_copy", "inplace_view", "dynamic_output_shape",
               "data_dependent_output", "reduction")
"""The tags :func:`tagged` answers for (the rare ones; ``pt2_compliant_tag``, ``out`` and the other
tags most overloads carry are read from the overloads themselves)."""


def tagged(tag: str) -> FrozenSet[str]:
    """The ATen overloads that carry ``tag`` (one of :data:`CACHED_TAGS`)."""
    if tag not in CACHED_TAGS:
        raise ValueError(f"tagged() answers for {', '.join(CACHED_TAGS)}, not {tag!r}")
    return _tag_table()[tag]


@functools.lru_cache(maxsize=1)
def _tag_table() -> Dict[str, FrozenSet[str]]:
    """Per tag of :data:`CACHED_TAGS`, the overloads that carry it. Reading tags means building
    the overloads' Python packets (about 0.2 s for this torch's ~1,500 packets, most of the
    sim's activation), so the table is cached (:func:`cached`)."""
    def build(names: Tuple[str, ...]) -> Dict[str, list]:
        table: Dict[str, list] = {tag: [] for tag in CACHED_TAGS}
        for name in names:
            for tag in overload(name).tags:
                if tag.name in table:
                    table[tag.name].append(name)
        return table

    stored = cached("tags", CACHED_TAGS, build)
    return {tag: frozenset(stored[tag]) for tag in CACHED_TAGS}


@functools.lru_cache(maxsize=1)
def with_generator() -> FrozenSet[str]:
    """The ATen overloads that take a ``Generator`` argument (random ones draw from it): read from
    their schemas once per torch build and its overload names, then cached (:func:`cached`)."""
    def build(names: Tuple[str, ...]) -> Dict[str, list]:
        return {"generator": [n for n in names
                              if any(str(a.type) == "Optional[Generator]" for a in schema_of(n).arguments)]}

    return frozenset(cached("schemas", ("generator",), build)["generator"])


def with_kernel(dispatch_key: str) -> FrozenSet[str]:
    """The ATen overloads with a kernel of their own on ``dispatch_key`` (``"SparseCPU"``): read
    from the dispatcher once per torch build and its overload names, then cached beside
    :func:`tagged`'s table (asking ~2,500 overloads costs about 25 ms a key)."""
    return _kernel_table(dispatch_key)


@functools.lru_cache(maxsize=None)
def _kernel_table(dispatch_key: str) -> FrozenSet[str]:
    stored = cached("kernels", (dispatch_key,),
                     lambda names: {dispatch_key: [n for n in names if _has(n, dispatch_key)]})
    return frozenset(stored[dispatch_key])


def cached(kind: str, keys: Tuple[str, ...], build: Callable[[Tuple[str, ...]], Dict[str, list]],
           salt: Tuple[str, ...] = ()) -> Dict[str, list]:
    """The table ``build(all_aten())`` (``key`` -> overload names for each of ``keys``), kept in a
    cache file keyed by the torch build, ``keys``, ``salt`` (what else the table is derived from,
    e.g. the source of the rules that build it) and the overload names (``$XDG_CACHE_HOME``, else
    ``~/.cache``, under ``flagos_torchfl/aten``); a cache that cannot be read or written is
    rebuilt in memory."""
    names = all_aten()
    digest = hashlib.sha256("\0".join((torch.__version__, os.path.dirname(torch.__file__), *keys, *salt,
                                        *names)).encode())
    path = os.path.join(_cache_dir(), f"{kind}-{digest.hexdigest()[:20]}.json")
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
        if all(isinstance(stored[k], list) for k in keys):
            return stored
    except (OSError, ValueError, KeyError, TypeError):
        pass
    table = build(names)
    _write_cache(path, table)
    return table


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "flagos_torchfl", "aten")


def _write_cache(path: str, table: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(table, f)
        os.replace(partial, path)
    except OSError:
        pass  # an unwritable cache: the table is rebuilt by the next process


def native_set(dispatch_key: str) -> FrozenSet[str]:
    """ATen overloads with a kernel registered for ``dispatch_key`` right now."""
    return frozenset(name for name in all_aten() if _has(name, dispatch_key))


def has_kernel(name: str, dispatch_key: str) -> bool:
    """Whether overload ``name`` has a kernel registered for ``dispatch_key``."""
    return _has(name, dispatch_key)


#: operators whose kernel at an autocast key shows that the key really casts
AUTOCAST_CORE_OPS = ("aten::linear", "aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::conv2d")


def autocast_casts(autocast_key: str) -> bool:
    """Whether autocast at ``autocast_key`` (``"AutocastPrivateUse1"``...) really casts: every
    operator of :data:`AUTOCAST_CORE_OPS` has a kernel there (PyTorch's, a plugin's, or rules
    registered by :mod:`flagos_torchfl.precision`)."""
    return all(_has(op, autocast_key) for op in AUTOCAST_CORE_OPS)


def has_computed_kernel(name: str, dispatch_key: str) -> bool:
    """Whether a call of ``name`` on ``dispatch_key`` finds a kernel (its own, or one of the
    composite kernels that serve every backend)."""
    return torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, dispatch_key)


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


def out_delegate(name: str) -> Optional[str]:
    """The ``out=`` overload through which PyTorch serves the functional or in-place overload
    ``name`` of a structured operator on every backend (its CompositeExplicitAutogradNonFunctional
    kernel allocates the result and calls it): ``aten::gelu`` -> ``aten::gelu.out``,
    ``aten::scatter_.src`` -> ``aten::scatter.src_out``. None when ``name`` has no such kernel."""
    if not _has(name, "CompositeExplicitAutogradNonFunctional"):
        return None
    packet, _, overload_name = name[len(PREFIX):].partition(".")
    functional = packet[:-1] if packet.endswith("_") and not packet.endswith("__") else packet
    known = overloads_by_packet().get(functional, ())
    for candidate in ((f"{PREFIX}{functional}.{overload_name}_out",) if overload_name else ()) + (
            f"{PREFIX}{functional}.out",):
        if candidate in known:
            return candidate
    return None


def routable(native: Iterable[str]) -> Tuple[str, ...]:
    """Overloads that reach the backend and are not in ``native``: what routing serves."""
    have = frozenset(native)
    return tuple(n for n in all_aten() if n not in have and needs_backend_kernel(n))


def has_backend_fallback(dispatch_key: str) -> bool:
    """True when something (a vendor plugin, or this package) holds the key's one fallback."""
    return torch._C._dispatch_has_backend_fallback(getattr(torch._C.DispatchKey, dispatch_key))
