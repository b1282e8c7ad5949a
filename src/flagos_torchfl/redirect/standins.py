"""Stand-ins: what a ``torch.cuda`` name becomes when the backend cannot serve it.

An *unserved stand-in* is a class that raises
:class:`~flagos_torchfl.errors.UnsupportedFeatureError`, naming the attribute and the backend,
as soon as it is called, instantiated or has an attribute read. Reading the name itself does not
raise, because libraries name CUDA-only types at import time (annotations such as
``torch.cuda.CUDAGraph | None`` in transformers, ``isinstance(v, torch.cuda.StreamContext)`` in
dynamo); ``isinstance(x, stand_in)`` is simply False. An *alias class* stands for a backend class
under the CUDA name (``torch.cuda.Stream`` constructing the backend's stream).
"""
from __future__ import annotations

import functools
import inspect
import types
from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import UnsupportedFeatureError
from .devices import Target

DENIED_PRIVATE = frozenset({"_record_memory_history", "_dump_snapshot", "_snapshot", "_sleep"})
#: no stand-in in hand for the real object
_MISSING = object()

def unsupported(name: str, target: Target, where: str = "torch.cuda",
                reason: Optional[Tuple[str, str]] = None) -> UnsupportedFeatureError:
    """The error for ``where.name`` on a backend that cannot serve it; ``reason``: (the chip,
    why it lacks the name) where the chip's device-module table says."""
    if reason is not None:
        chip, why = reason
        return UnsupportedFeatureError(f"{where}.{name} is not available on {chip}: {why} "
                                       f"(backend {target.chip_name!r}, device type {target.device_type!r})")
    return UnsupportedFeatureError(
        f"{where}.{name} is not available on backend {target.chip_name!r} (device type {target.device_type!r})")


class _UnservedMeta(type):
    """Stand-ins raise on use: calling, instantiating, reading an attribute."""

    def __call__(cls, *args, **kwargs):
        _check_arguments(cls, args, kwargs)
        raise cls._error()

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise cls._error()


def _check_arguments(stand_in: type, args: tuple, kwargs: dict) -> None:
    """Raise the TypeError the real object would for a call whose arguments do not fit its
    signature: argument errors come before feature errors, as on CUDA. Nothing when the real
    object is unknown or has no signature Python can read."""
    real = vars(stand_in).get("__wrapped__", _MISSING)
    if real is _MISSING:
        return
    try:
        signature = inspect.signature(real)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{getattr(real, '__qualname__', stand_in.__name__)}(): {exc}") from None


def introspection(real: Any) -> Dict[str, Any]:
    """What ``functools.wraps(real)`` gives a wrapper, as class attributes: ``__wrapped__`` (so
    ``inspect.unwrap`` and ``inspect.signature`` reach ``real`` and its own wrapped chain),
    ``__name__``, ``__qualname__``, ``__module__``, ``__doc__``, ``__annotations__``, and a
    function's own attributes. Code that inspects ``torch.cuda`` names at import (dynamo reads
    ``torch.cuda.use_mem_pool.__wrapped__``) sees what it would see without the facade."""
    found: Dict[str, Any] = {}
    if isinstance(real, types.FunctionType):
        found.update((k, v) for k, v in vars(real).items() if not k.startswith("__"))
    for attr in functools.WRAPPER_ASSIGNMENTS:
        try:
            value = getattr(real, attr)
        except Exception:  # noqa: BLE001 - a missing or raising attribute is simply not copied
            continue
        if attr in ("__name__", "__qualname__", "__module__") and not isinstance(value, str):
            continue
        found[attr] = value
    found["__wrapped__"] = real
    return found


def unserved(name: str, target: Target, where: str = "torch.cuda", reason: Optional[Tuple[str, str]] = None,
             on_use: Optional[Callable[[], None]] = None, real: Any = _MISSING) -> type:
    """The stand-in for ``where.name``: a class that raises UnsupportedFeatureError on use
    (``reason`` as for :func:`unsupported`), calling ``on_use`` first. Given the ``real`` object
    it stands for, it carries that object's introspection attributes (:func:`introspection`)."""
    error = unsupported(name, target, where, reason)

    def _error() -> UnsupportedFeatureError:
        if on_use is not None:
            on_use()
        return UnsupportedFeatureError(str(error))

    namespace: Dict[str, Any] = {"__module__": where, "__doc__": str(error), "__qualname__": name}
    if real is not _MISSING:
        namespace.update(introspection(real))
    namespace["_error"] = staticmethod(_error)
    return _UnservedMeta(namespace.get("__name__", name), (), namespace)


def alias_class(real: type, make: Callable[..., Any], module: str = "torch.cuda") -> type:
    """A class standing for ``real``: constructing it calls ``make`` (which returns a ``real``
    instance) and ``isinstance``/``issubclass`` answer as for ``real``."""

    class _Meta(type):
        def __instancecheck__(cls, instance):
            return isinstance(instance, real)

        def __subclasscheck__(cls, subclass):
            return issubclass(subclass, real)

    def __new__(cls, *args, **kwargs):
        return make(*args, **kwargs)

    namespace = introspection(real)
    namespace.update(__new__=__new__, __module__=module)
    return _Meta(real.__name__, (), namespace)


class Namespace(types.ModuleType):
    """A stand-in for a ``torch.cuda`` submodule: served names, private names of the real
    submodule, unserved stand-ins for its other names, AttributeError for names it lacks."""

    def __init__(self, name: str, served: Dict[str, Any], real: Any, target: Target,
                 delegate: Optional[Callable[[str], Any]] = None):
        """``delegate(name)``: the backend's answer for a public name the namespace does not
        serve itself (None: it has none, and the name gets a stand-in)."""
        super().__init__(name, getattr(real, "__doc__", None))
        self.__dict__.update(served)
        self._real, self._target, self._delegate = real, target, delegate

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name.startswith("_") and name not in DENIED_PRIVATE and self._real is not None:
            return getattr(self._real, name)
        if self._real is not None and not hasattr(self._real, name):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        found = self._delegate(name) if self._delegate is not None and not name.startswith("_") else None
        if found is not None:
            return found
        stand_in = unserved(name, self._target, self.__name__,
                            real=_MISSING if self._real is None else getattr(self._real, name, _MISSING))
        setattr(self, name, stand_in)
        return stand_in
