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

import types
from typing import Any, Callable, Dict, Optional, Tuple

from ..errors import UnsupportedFeatureError
from .devices import Target

DENIED_PRIVATE = frozenset({"_record_memory_history", "_dump_snapshot", "_snapshot", "_sleep"})
#: hints added to the error of some unserved names
HINTS = {
    "graph": "CUDA graphs are a CUDA-only feature",
    "CUDAGraph": "CUDA graphs are a CUDA-only feature",
    "make_graphed_callables": "CUDA graphs are a CUDA-only feature",
}
#: the legacy ``torch.cuda.<X>Tensor`` types and their dtypes

def unsupported(name: str, target: Target, where: str = "torch.cuda",
                reason: Optional[Tuple[str, str]] = None) -> UnsupportedFeatureError:
    """The error for ``where.name`` on a backend that cannot serve it; ``reason``: (the chip,
    why it lacks the name) where the chip's device-module table says."""
    if reason is not None:
        chip, why = reason
        return UnsupportedFeatureError(f"{where}.{name} is not available on {chip}: {why} "
                                       f"(backend {target.backend!r}, device type {target.device_type!r})")
    hint = HINTS.get(name)
    return UnsupportedFeatureError(
        f"{where}.{name} is not available on backend {target.backend!r} "
        f"(device type {target.device_type!r}){': ' + hint if hint else ''}"
    )


class _UnservedMeta(type):
    """Stand-ins raise on use: calling, instantiating, reading an attribute."""

    def __call__(cls, *args, **kwargs):
        raise cls._error()

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise cls._error()


def unserved(name: str, target: Target, where: str = "torch.cuda", reason: Optional[Tuple[str, str]] = None,
             on_use: Optional[Callable[[], None]] = None) -> type:
    """The stand-in for ``where.name``: a class that raises UnsupportedFeatureError on use
    (``reason`` as for :func:`unsupported`), calling ``on_use`` first."""
    error = unsupported(name, target, where, reason)

    def _error() -> UnsupportedFeatureError:
        if on_use is not None:
            on_use()
        return UnsupportedFeatureError(str(error))

    return _UnservedMeta(name, (), {"_error": staticmethod(_error), "__module__": where, "__doc__": str(error)})


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

    return _Meta(real.__name__, (), {"__new__": __new__, "__module__": module, "__doc__": real.__doc__})


class Namespace(types.ModuleType):
    """A stand-in for a ``torch.cuda`` submodule: served names, private names of the real
    submodule, unserved stand-ins for its other names, AttributeError for names it lacks."""

    def __init__(self, name: str, served: Dict[str, Any], real: Any, target: Target):
        super().__init__(name)
        self.__dict__.update(served)
        self._real, self._target = real, target

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name.startswith("_") and name not in DENIED_PRIVATE and self._real is not None:
            return getattr(self._real, name)
        if self._real is not None and not hasattr(self._real, name):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        stand_in = unserved(name, self._target, self.__name__)
        setattr(self, name, stand_in)
        return stand_in
