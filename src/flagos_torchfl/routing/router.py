"""The router: gives every operator the active backend lacks a route, by priority
library -> composite -> fallback, else a clear :class:`OperatorNotSupportedError`.

A decision is made once per (operator, dtypes of its tensor arguments, autograd needed or not)
and cached; afterwards a call costs a dictionary lookup plus the route itself. Operators the
backend has natively are never intercepted (the router registers nothing on them) unless an
override forces another route or the backend declares a dtype gap for them.
"""
from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, Optional, Tuple

import torch

from .. import compat
from ..errors import OperatorNotSupportedError
from ..log import get_logger
from ..registrations import keep_at_exit
from ..aten import dispatcher
from ..aten.dtypes import call_signature, dtype_mask, dtype_names, dtypes_of
from . import composite, fallback, schema
from .composite import CompositeAbort
from .report import Stats

log = get_logger("routing")
ROUTE_ORDER = ("library", "composite", "fallback")
_PENDING = object()
_NUMBERS = (bool, int, float, complex)
_TAGS = {"library": "library-op", "composite": "composite-op", "fallback": "cpu-fallback"}

@dataclasses.dataclass(frozen=True)
class Decision:
    """The route chosen for one cache key. ``detail`` names the provider or decomposition;
    ``tried`` lists the routes that were tried before and why each could not serve."""

    route: str
    detail: str = ""
    tried: Tuple[Tuple[str, str], ...] = ()
    fn: Optional[Callable[..., Any]] = None


@dataclasses.dataclass(frozen=True)
class Policy:
    """What the router knows about the chip, fixed at activation."""

    chip_name: str
    dispatch_key: str
    device_type: str
    native: FrozenSet[str]
    #: overload -> dtype bit set the backend lacks for it although the overload is native
    dtype_gaps: Dict[str, int] = dataclasses.field(default_factory=dict)
    #: overload -> (route, the entry as written, source)
    overrides: Dict[str, Tuple[str, str, str]] = dataclasses.field(default_factory=dict)
    #: overload -> [(provider name, ProviderKernel)], best first
    library: Dict[str, list] = dataclasses.field(default_factory=dict)
    #: the chip's counters of collectives staged through host memory (Backend.collective_staging)
    collective_staging: Optional[Callable[[], Optional[Mapping[str, int]]]] = None


class Router:
    """Routes the operators of one backend; :meth:`install` registers it with the dispatcher."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self.stats = Stats()
        #: how many decisions were made (a cached call makes none)
        self.decisions = 0
        #: overloads this router registered a kernel for, and whether a backend fallback is ours
        self.registered: Dict[str, str] = {}
        self.uses_fallback = False
        self._cache: Dict[tuple, Decision] = {}
        self._announced: set = set()
        #: (cache key, kinds of the Python numbers passed) whose composite calls passed the
        #: operator's own checks on the host
        self._checked: set = set()
        self._lock = threading.RLock()
        self._libs: List[torch.library.Library] = []
        self._mechanism = "auto"
        self._local = threading.local()
        #: called as ``watch(overload, route)`` after each routed call (e.g. the fallback budget)
        self.watch: Optional[Callable[[str, str], None]] = None
        #: called as ``pause_native(True)`` when the calling thread begins a route and with False
        #: when it ends it (the native calls a route makes are its work: the census counts them
        #: as the route's)
        self.pause_native: Optional[Callable[[bool], None]] = None

    # ------------------------------------------------------------------ dispatcher entry
    def call(self, op, args: tuple, kwargs: dict) -> Any:
        """Run ``op`` by its route (deciding it on the first call for this key)."""
        local = self._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        pause = self.pause_native if depth == 0 else None
        if pause is not None:
            pause(True)
        try:
            return self._call(op, args, kwargs, depth > 0)
        finally:
            local.depth = depth
            if pause is not None:
                pause(False)

    def _call(self, op, args: tuple, kwargs: dict, nested: bool) -> Any:
        frames = composite.stack()
        if frames and op in frames:
            raise CompositeAbort(op, f"its decomposition re-enters {schema.qualified_name(op)}")
        if fallback.runs_on_host(op):
            raise fallback.RouteUnavailable(f"the host kernel of {schema.qualified_name(op)} is routed "
                                            "too (the backend's dispatch key is the host's)")
        if fallback.in_transfer():
            raise OperatorNotSupportedError(schema.qualified_name(op), self.policy.chip_name, [
                ("fallback", "it is needed to copy operands between the host and the device")])
        mask, training = call_signature(args, kwargs)
        key = (op, mask, training)
        start = time.perf_counter_ns()
        decision = self._cache.get(key)
        result, nbytes = _PENDING, 0
        if decision is None:
            decision, result, nbytes = self._decide(op, key, args, kwargs)
        route = decision.route
        if result is _PENDING:
            if frames and route in ("fallback", "unsupported"):
                raise CompositeAbort(frames[-1], f"its part {schema.qualified_name(op)} has no route "
                                     f"on the chip (it would need the {route} route)")
            try:
                if route == "composite":
                    self._check_arguments(op, key, args, kwargs)
                result, nbytes, route = self._execute(op, decision, args, kwargs)
            except CompositeAbort:
                raise
            except BaseException:
                self.stats.record(schema.qualified_name(op), route, mask,
                                  time.perf_counter_ns() - start, 0, nested)
                raise
        name = schema.qualified_name(op)
        self.stats.record(name, route, mask, time.perf_counter_ns() - start, nbytes, nested)
        if self.watch is not None:
            self.watch(name, route)
        return result

    # ------------------------------------------------------------------ deciding
    def _decide(self, op, key: tuple, args: tuple, kwargs: dict):
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                return cached, _PENDING, 0
            self.decisions += 1
            name = schema.qualified_name(op)
            forced = self.policy.overrides.get(name)
            order = (forced[0],) if forced else ROUTE_ORDER
            tried: List[Tuple[str, str]] = []
            if forced:
                tried.append(("override", f"{forced[2]} sets {forced[1]}"))
            elif name in self.policy.native:
                lacking = ", ".join(map(str, dtypes_of(key[1] & self.policy.dtype_gaps.get(name, 0))))
                tried.append(("native", f"{self.policy.chip_name} lacks {lacking} for it" if lacking else
                              f"this torch cannot keep {self.policy.chip_name}'s native kernel beside the "
                              "route of its dtype gap, so every dtype is routed"))
            error: Optional[BaseException] = None
            for route in order:
                if route in ("native", "unsupported"):
                    tried.append((route, "forced by the override, and the chip has no native kernel "
                                  "for this call" if route == "native" else "forced by the override"))
                    continue
                step = self._TRY[route](self, op, key, args, kwargs, tried)
                if step is None:
                    continue
                if isinstance(step, BaseException):
                    error = step
                    continue
                decision, result, nbytes = step
                if error is None or result is not _PENDING:
                    self._keep(key, name, decision)
                return decision, result, nbytes
            if error is not None:
                raise OperatorNotSupportedError(name, self.policy.chip_name, tried) from error
            decision = Decision("unsupported", "", tuple(tried))
            self._keep(key, name, decision)
            return decision, _PENDING, 0

    def _try_library(self, op, key, args, kwargs, tried):
        name = schema.qualified_name(op)
        offers = self.policy.library.get(name, [])
        if not offers:
            tried.append(("library", "no kernel library implements it"))
            return None
        dtypes, training = dtypes_of(key[1]), key[2]
        usable = [(p, k) for p, k in offers if k.serves(dtypes, training)]
        if not usable:
            mode = "with autograd" if training else "without autograd"
            tried.append(("library", f"{', '.join(p for p, _ in offers)} do not implement it for "
                          f"{', '.join(map(str, dtypes)) or 'these arguments'} {mode}"))
            return None
        provider, kernel = usable[0]
        try:
            result = kernel.fn(*args, **kwargs)
        except CompositeAbort:
            raise
        except Exception as exc:
            tried.append(("library", f"the {provider} kernel raised {type(exc).__name__}: {exc}"))
            return exc
        return Decision("library", provider, tuple(tried), kernel.fn), result, 0

    def _try_composite(self, op, key, args, kwargs, tried):
        found = composite.find(op)
        if found is None:
            why = "a view has no decomposition" if schema.is_view(op) else "no decomposition in torch's tables"
            tried.append(("composite", why))
            return None
        fn, source = found
        self._check_arguments(op, key, args, kwargs)
        try:
            result = composite.run(op, fn, args, kwargs)
        except CompositeAbort as abort:
            if abort.target is not op:
                raise
            tried.append(("composite", abort.reason))
            return None
        except Exception as exc:
            tried.append(("composite", f"the decomposition raised {type(exc).__name__}: {exc}"))
            return exc
        wrong = composite.mismatch(op, args, kwargs, result)
        if wrong:
            tried.append(("composite", wrong))
            return None
        return Decision("composite", source, tuple(tried), fn), result, 0

    def _try_fallback(self, op, key, args, kwargs, tried):
        why = fallback.can_run(op)
        if why:
            tried.append(("fallback", why))
            return None
        decision = Decision("fallback", "host round trip", tuple(tried))
        if composite.stack():
            return decision, _PENDING, 0
        try:
            result, nbytes = fallback.run(op, args, kwargs, self.policy.device_type)
        except fallback.RouteUnavailable as exc:
            tried.append(("fallback", str(exc)))
            return None
        return decision, result, nbytes

    def _check_arguments(self, op, key: tuple, args: tuple, kwargs: dict) -> None:
        """Raise what the operator itself raises for this call before a decomposition stands
        in for it (:func:`fallback.check_on_host`): once per cache key and kinds of Python
        numbers passed (``index_fill_`` takes ``0`` and refuses ``1+1j`` on a float tensor),
        again on every call that was refused."""
        checked = (key, _number_kinds(args, kwargs))
        if checked in self._checked:
            return
        fallback.check_on_host(op, args, kwargs, self.policy.device_type)
        self._checked.add(checked)

    def _keep(self, key: tuple, name: str, decision: Decision) -> None:
        self._cache[key] = decision
        tag = _TAGS.get(decision.route)
        if tag and (name, decision.route) not in self._announced:
            self._announced.add((name, decision.route))
            dtypes = ", ".join(dtype_names(key[1])) or "no tensors"
            how = {"library": f"runs on the {decision.detail} kernel library",
                   "composite": f"runs as a decomposition ({decision.detail})",
                   "fallback": "runs on the host (CPU fallback, operands copied both ways)"}[decision.route]
            tried = "; ".join(f"{r}: {w}" for r, w in decision.tried)
            log.info("[%s] %s (%s%s) on %s %s%s", tag, name, dtypes, ", autograd" if key[2] else "",
                     self.policy.chip_name, how, f" [{tried}]" if tried else "")

    # ------------------------------------------------------------------ running
    def _execute(self, op, decision: Decision, args: tuple, kwargs: dict):
        """(result, host bytes copied, the route taken: a composite that cannot serve a call
        takes the fallback)."""
        run = self._RUN.get(decision.route)
        if run is None:
            raise OperatorNotSupportedError(schema.qualified_name(op), self.policy.chip_name, list(decision.tried))
        return run(self, op, decision, args, kwargs)

    def _run_library(self, op, decision: Decision, args: tuple, kwargs: dict):
        return decision.fn(*args, **kwargs), 0, "library"

    def _run_composite(self, op, decision: Decision, args: tuple, kwargs: dict):
        try:
            return composite.run(op, decision.fn, args, kwargs), 0, "composite"
        except CompositeAbort as abort:
            if abort.target is not op:
                raise
            self.stats.miss(schema.qualified_name(op))
            frames = composite.stack()
            if frames:
                raise CompositeAbort(frames[-1], abort.reason) from None
            if fallback.can_run(op) is None:
                return self._run_fallback(op, decision, args, kwargs)
            raise OperatorNotSupportedError(schema.qualified_name(op), self.policy.chip_name,
                                            [*decision.tried, ("composite", abort.reason)]) from None

    def _run_fallback(self, op, decision: Decision, args: tuple, kwargs: dict):
        return (*self._run_on_host(op, decision, args, kwargs), "fallback")

    #: each route's trial (deciding, on a first call) and run (every later call)
    _TRY = {"library": _try_library, "composite": _try_composite, "fallback": _try_fallback}
    _RUN = {"library": _run_library, "composite": _run_composite, "fallback": _run_fallback}

    def _run_on_host(self, op, decision: Decision, args: tuple, kwargs: dict):
        try:
            return fallback.run(op, args, kwargs, self.policy.device_type)
        except fallback.RouteUnavailable as exc:
            raise OperatorNotSupportedError(schema.qualified_name(op), self.policy.chip_name,
                                            [*decision.tried, ("fallback", str(exc))]) from None

    # ------------------------------------------------------------------ registration
    def _fallback_kernel(self, op, *args, **kwargs):
        return self.call(op, args, kwargs)

    def _kernel_for(self, op) -> Callable[..., Any]:
        def kernel(*args, **kwargs):
            return self.call(op, args, kwargs)

        return kernel

    def _gap_kernel_for(self, op, gap: int, native) -> Callable[..., Any]:
        tensor_args = tuple(i for i, a in enumerate(op._schema.arguments)
                            if not a.kwarg_only and str(a.type) in ("Tensor", "Optional[Tensor]"))

        def kernel(keyset, *args, **kwargs):
            if call_signature(args, kwargs)[0] & gap:
                return self.call(op, args, kwargs)
            if any(i < len(args) and isinstance(args[i], _NUMBERS) for i in tensor_args):
                # a wrapped-number argument (``x * 0.5``) reaches a Python kernel as a number,
                # which the native kernel's boxed call refuses for a Tensor parameter
                args = tuple(torch.tensor(a) if i in tensor_args and isinstance(a, _NUMBERS) else a
                             for i, a in enumerate(args))
            return native.call_boxed(keyset, *args, **kwargs)

        return kernel

    def plan(self, mechanism: str = "auto") -> Tuple[bool, Dict[str, str]]:
        """(use a backend fallback?, overload -> why it gets its own kernel)."""
        key = self.policy.dispatch_key
        native = self.policy.native
        per_op: Dict[str, str] = {}
        for name in dispatcher.stub_composites():
            if name not in native:
                per_op[name] = "its CompositeExplicitAutograd kernel is a stub that raises"
        for name, (route, given, where) in self.policy.overrides.items():
            if route != "native" and not dispatcher.is_implicit(name):
                per_op.setdefault(name, f"{where} sets {given}")
        for name in self.policy.dtype_gaps:
            if name in native and name not in per_op:
                per_op[name] = "the backend lacks it for some dtypes"
        vendor = dispatcher.has_backend_fallback(key)
        can_fallback = compat.has("library_fallback")
        use_fallback = mechanism != "per-op" and can_fallback and not vendor
        if not use_fallback:
            for name in dispatcher.routable(native):
                if name in per_op:
                    continue
                if vendor and not (self.policy.library.get(name) or _has_decomposition(name)):
                    continue
                per_op[name] = "no backend fallback can be registered: per-operator kernel"
        return use_fallback, per_op

    def install(self, mechanism: str = "auto") -> Callable[[], None]:
        """Register with the dispatcher; returns the undo. ``mechanism``: ``auto`` (a backend
        fallback where possible), ``per-op`` (per-operator kernels only, as on a torch without ``Library.fallback``)."""
        self._mechanism = mechanism
        composite.table()
        use_fallback, per_op = self.plan(mechanism)
        key = self.policy.dispatch_key
        lib = keep_at_exit(torch.library.Library("aten", "IMPL"))
        self._libs.append(lib)
        for name, why in sorted(per_op.items()):
            if name in self.policy.native:  # overriding the chip's kernel on purpose
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    self._register(lib, name, key)
            else:
                self._register(lib, name, key)
            self.registered[name] = why
        if use_fallback:
            flib = keep_at_exit(torch.library.Library("_", "IMPL"))
            flib.fallback(self._fallback_kernel, key)
            self._libs.append(flib)
            self.uses_fallback = True
        log.debug("routing for %s on %s: %s, %d per-operator kernels", self.policy.chip_name, key,
                  "backend fallback" if use_fallback else "no backend fallback", len(per_op))
        return self.uninstall

    def _register(self, lib, name: str, key: str) -> None:
        op = dispatcher.overload(name)
        gap = self.policy.dtype_gaps.get(name)
        if gap and name in self.policy.native and name not in self.policy.overrides:
            if not compat.has("library_get_kernel"):
                log.warning("%s: torch %s cannot keep the native kernel beside a dtype route; "
                            "the dtype gap is routed for every dtype", name, torch.__version__)
                lib.impl(name.partition("::")[2], self._kernel_for(op), key)
                return
            native = torch.library.get_kernel(op, key)
            lib.impl(name.partition("::")[2], self._gap_kernel_for(op, gap, native), key, with_keyset=True)
        else:
            lib.impl(name.partition("::")[2], self._kernel_for(op), key)

    def uninstall(self) -> None:
        """Remove every registration this router made."""
        for lib in reversed(self._libs):
            compat.destroy_library(lib)
        self._libs.clear()
        self.registered.clear()
        self.uses_fallback = False

    def reconfigure(self, overrides: Dict[str, Tuple[str, str, str]]) -> None:
        """Apply new overrides: registrations are redone and every decision is made afresh."""
        with self._lock:
            self.uninstall()
            self.policy = dataclasses.replace(self.policy, overrides=dict(overrides))
            self._cache.clear()
            self._checked.clear()
            self.install(self._mechanism)

    def decision_for(self, op, dtypes=(torch.float32,), training: bool = False) -> Optional[Decision]:
        """The cached decision for a key, or None when none was made yet."""
        return self._cache.get((op, dtype_mask(dtypes), training))

    def cached(self) -> List[Tuple[str, List[torch.dtype], bool, Decision]]:
        """Every cached decision: (overload, dtypes, autograd needed, decision)."""
        return [(schema.qualified_name(op), dtypes_of(mask), training, d)
                for (op, mask, training), d in list(self._cache.items())]


def _number_kinds(args: tuple, kwargs: dict) -> tuple:
    """The types of the Python numbers among the arguments, in order (a call's scalars can pass
    or fail an operator's checks by their kind alone)."""
    kinds = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, _NUMBERS):
            kinds.append(type(value))
        elif isinstance(value, (list, tuple)):
            kinds.extend(type(v) for v in value if isinstance(v, _NUMBERS))
    return tuple(kinds)


def _has_decomposition(name: str) -> bool:
    return composite.find(dispatcher.overload(name)) is not None
