"""The ordered registry of redirection patches and the recorder that makes each one undoable.

A patch is a small function ``fn(target, patcher)`` registered with :func:`patch_function`. It
changes torch only through the :class:`Patcher` it is given, which records what was there
before (an attribute of a module or class, a dict entry, a module's class), so that
:meth:`Patcher.undo` puts back exactly the original objects, in reverse order.

Patches run in registration order; the families register in the order ``redirect/__init__``
imports them.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import types
from typing import Any, Callable, Iterable, List, Tuple

_MISSING = object()


@dataclasses.dataclass(frozen=True)
class Patch:
    """One named patch. ``on_cuda``: also needed when the backend *is* CUDA (NVIDIA or ROCm)
    but ``gpu_ids`` renumbers devices; otherwise a CUDA backend skips it."""

    name: str
    apply: Callable[[Any, "Patcher"], None]
    on_cuda: bool


REGISTRY: List[Patch] = []


def patch_function(name: str, on_cuda: bool = False) -> Callable:
    """Register the decorated ``fn(target, patcher)`` as the next patch called ``name``.

    Names are unique; registering a name twice raises ValueError.
    """

    def register(fn: Callable[[Any, "Patcher"], None]) -> Callable[[Any, "Patcher"], None]:
        if any(p.name == name for p in REGISTRY):
            raise ValueError(f"redirect patch {name!r} is registered twice")
        REGISTRY.append(Patch(name, fn, on_cuda))
        return fn

    return register


class Patcher:
    """Applies changes to torch and remembers how to take each one back.

    Every change is recorded before it is made, so a patch that fails halfway can still be
    undone completely. :meth:`undo` restores in reverse order and may be called once.
    """

    def __init__(self) -> None:
        self._log: List[Tuple[str, Any, Any, Any]] = []

    def setattr(self, owner: Any, name: str, value: Any) -> Any:
        """Set ``owner.name = value`` (a module or class); return the value seen before.

        Undo restores the owner's own entry: an attribute that was only inherited (e.g.
        ``torch.Tensor.to`` comes from ``torch._C.TensorBase``) is deleted again.
        """
        own = vars(owner).get(name, _MISSING)
        previous = getattr(owner, name)
        self._log.append(("attr", owner, name, own))
        setattr(owner, name, value)
        return previous

    def setitem(self, mapping: dict, key: Any, value: Any) -> None:
        """Set ``mapping[key] = value``; undo restores the old value or removes the key."""
        self._log.append(("item", mapping, key, mapping.get(key, _MISSING)))
        mapping[key] = value

    def set_module_class(self, module: types.ModuleType, cls: type) -> None:
        """Give ``module`` the ModuleType subclass ``cls``; undo restores its former class."""
        self._log.append(("class", module, None, type(module)))
        module.__class__ = cls

    def wrap(self, owner: Any, name: str, make: Callable[[Callable], Callable]) -> Callable:
        """Replace ``owner.name`` by ``make(original)``; returns the original."""
        original = getattr(owner, name)
        self.setattr(owner, name, make(original))
        return original

    def replace_in(self, owners: Iterable[Any], name: str, original: Any, replacement: Any) -> None:
        """Set ``owner.name = replacement`` on each of ``owners`` (modules; None is skipped) that
        still holds ``original``: the modules that took a function by name at import."""
        for owner in owners:
            if getattr(owner, name, None) is original:
                self.setattr(owner, name, replacement)

    def wrap_arguments(self, owner: Any, name: str, edit: Callable[[dict], None]) -> Callable:
        """Replace ``owner.name`` by :func:`with_edited_arguments` of it; returns the original."""
        return self.wrap(owner, name, lambda original: with_edited_arguments(original, edit))

    def undo(self) -> None:
        """Restore every recorded change, newest first; a change that cannot be restored does
        not stop the others (RuntimeError listing those that failed, at the end)."""
        failed = []
        while self._log:
            entry = self._log.pop()
            try:
                _restore(*entry)
            except Exception as exc:
                failed.append(f"{entry[0]} {entry[2] or type(entry[1]).__name__}: {exc}")
        if failed:
            raise RuntimeError("could not restore: " + "; ".join(failed))

    def __len__(self) -> int:
        return len(self._log)


def with_edited_arguments(original: Callable, edit: Callable[[dict], None]) -> Callable:
    """A wrapper of ``original`` that binds each call's arguments to its signature, lets
    ``edit`` change that name -> value dict in place (a removed name takes its default), then
    calls ``original`` with them."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        edit(bound.arguments)
        return original(*bound.args, **bound.kwargs)

    return wrapper


def _restore(kind: str, owner: Any, key: Any, old: Any) -> None:
    """Put back one change recorded by :class:`Patcher`."""
    if kind == "attr":
        if old is _MISSING:
            if key in vars(owner):
                delattr(owner, key)
        else:
            setattr(owner, key, old)
    elif kind == "item":
        if old is _MISSING:
            owner.pop(key, None)
        else:
            owner[key] = old
    else:
        owner.__class__ = old
