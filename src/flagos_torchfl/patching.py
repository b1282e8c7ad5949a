"""The recorder of every change this package makes to torch.

A :class:`Patcher` applies changes (an attribute of a module or class, a dict entry, a module's
class, a change with its own undo) and records what was there before, so that
:meth:`Patcher.undo` puts back exactly the original objects, in reverse order. A change to a
module the program has not imported yet waits for its import (:meth:`Patcher.when_imported`, an
:class:`ImportHook` on ``sys.meta_path``), so applying changes imports nothing the program has not.
The redirection's patches (``redirect/patches.py``) and the sim's (``sim/integration/torch_patches.py``)
go through it.
"""
from __future__ import annotations

import functools
import inspect
import sys
import threading
import types
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .log import get_logger

_MISSING = object()
log = get_logger("redirect")


def imported(name: str) -> Optional[types.ModuleType]:
    """The module ``name`` if the program has imported it and it has finished executing."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    if module is None or getattr(spec, "_initializing", False):
        return None
    return module


class ImportHook:
    """A ``sys.meta_path`` finder that calls ``callback(module)`` once the module ``name`` it
    waits for has been imported and has finished executing, before the importer receives it.

    It finds nothing itself: it asks the finders after it for the module's spec and wraps its
    loader (the module keeps its own loader once it runs). Every other import costs one dict
    lookup. A module that was already being imported when it began to wait (found before the
    hook was there, see :meth:`wait_unfinished`) gets its callbacks at the first import after
    its own has finished. Each callback runs in its own ``try``: one that raises is logged and
    the others still run. :meth:`remove` takes it off ``sys.meta_path`` and drops every
    callback not yet called, including one whose module is being imported at that moment.
    """

    def __init__(self) -> None:
        self._waiting: Dict[str, List[Callable[[types.ModuleType], None]]] = {}
        self._unfinished: set = set()
        self._lock = threading.RLock()
        self._installed = False

    def wait_for(self, name: str, callback: Callable[[types.ModuleType], None]) -> None:
        """Call ``callback(module)`` when ``name`` has been imported (installs the hook)."""
        with self._lock:
            self._waiting.setdefault(name, []).append(callback)
            if not self._installed:
                sys.meta_path.insert(0, self)
                self._installed = True

    def take_back(self, name: str, callback: Callable[[types.ModuleType], None]) -> bool:
        """Stop waiting with ``callback`` for ``name``; False when it was no longer waiting
        (it has been called, or is being called)."""
        with self._lock:
            callbacks = self._waiting.get(name, [])
            if callback not in callbacks:
                return False
            callbacks.remove(callback)
            if not callbacks:
                del self._waiting[name]
                self._unfinished.discard(name)
            return True

    def wait_unfinished(self, name: str) -> None:
        """``name`` is in ``sys.modules`` but still executing, through a loader this hook did
        not wrap: call its callbacks at the first import that reaches the hook once it has
        finished (forget it if its import fails: a new import of it is found as usual)."""
        with self._lock:
            self._unfinished.add(name)

    def _finish_unfinished(self) -> None:
        with self._lock:
            done = [n for n in self._unfinished if n not in sys.modules or imported(n) is not None]
            self._unfinished.difference_update(done)
        for name in done:
            module = imported(name)
            if module is not None:
                self._executed(module)

    def waiting(self) -> List[str]:
        """Names of the modules still waited for."""
        with self._lock:
            return list(self._waiting)

    def remove(self) -> None:
        """Stop waiting: nothing is called for a module imported from now on."""
        with self._lock:
            self._waiting.clear()
            self._unfinished.clear()
            if self._installed:
                try:
                    sys.meta_path.remove(self)
                except ValueError:  # taken off by someone else (a test resetting meta_path)
                    pass
                self._installed = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if self._unfinished:
            self._finish_unfinished()
        if fullname not in self._waiting:
            return None
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderThenCall(spec.loader, self)
                return spec
        return None

    def _executed(self, module: types.ModuleType) -> None:
        with self._lock:
            callbacks = self._waiting.pop(module.__name__, [])
            self._unfinished.discard(module.__name__)
        for callback in callbacks:
            try:  # the program's import must succeed whatever a callback does
                callback(module)
            except Exception as exc:
                log.error("a change waiting for %s failed as it was imported (%s: %s)",
                          module.__name__, type(exc).__name__, exc)


class _LoaderThenCall:
    """Loads a module with its own loader, then hands it to the hook's callbacks."""

    def __init__(self, loader: Any, hook: ImportHook) -> None:
        self._loader, self._hook = loader, hook

    def create_module(self, spec: Any) -> Optional[types.ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        self._hook._executed(module)


class Patcher:
    """Applies changes to torch and remembers how to take each one back.

    Every change is recorded before it is made, so a patch that fails halfway can still be
    undone completely. :meth:`undo` restores in reverse order and may be called once.
    """

    def __init__(self) -> None:
        self._log: List[Tuple[str, Any, Any, Any]] = []
        self._rebound: List[Tuple[str, Any, Any]] = []
        self._hook: Optional[ImportHook] = None
        self._lock = threading.RLock()

    def when_imported(self, module: str, change: Callable[[types.ModuleType], None], label: str) -> bool:
        """Run ``change(module object)`` now if ``module`` has been imported, else when the
        program imports it; returns True if it has run by the time this returns. ``label``
        names the change in errors.

        A module that is in ``sys.modules`` but still executing (this call comes from its own
        import, or another thread's) gets the change once its import has finished (see
        :meth:`ImportHook.wait_unfinished`); one that another thread finished importing while
        the change was being queued gets it now.

        A change run now raises what it raises (the caller undoes everything). A change run at
        the program's import that raises is undone alone and reported as a RuntimeWarning; the
        import itself succeeds, with the module as torch defines it. After :meth:`undo` nothing
        runs any more.
        """
        found = imported(module)
        if found is not None:
            change(found)
            return True

        def at_import(loaded: types.ModuleType) -> None:
            self._run_at_import(loaded, change, label)

        with self._lock:
            if self._hook is None:
                self._hook = ImportHook()
            hook = self._hook
            hook.wait_for(module, at_import)
        found = imported(module)  # imported meanwhile, past the finders the hook sits in front of
        if found is not None:
            if hook.take_back(module, at_import):
                change(found)
            return True
        if module in sys.modules:  # half-way through an import found before the hook waited
            hook.wait_unfinished(module)
        return False

    def waiting(self) -> List[str]:
        """Modules that changes still wait for (in no particular order)."""
        with self._lock:
            return self._hook.waiting() if self._hook is not None else []

    def _run_at_import(self, module: types.ModuleType, change: Callable, label: str) -> None:
        with self._lock:
            if self._hook is None:  # undone while the module was being imported
                return
            mark, rebound = len(self._log), len(self._rebound)
            try:
                change(module)
                log.info("redirect patch %s applied as %s was imported", label, module.__name__)
            except Exception as exc:
                del self._rebound[rebound:]
                message = (f"flagos_torchfl: redirect patch {label!r} of {module.__name__} failed "
                           f"({type(exc).__name__}: {exc}); {module.__name__} is left as torch defines it")
                try:
                    self._undo_to(mark)
                except Exception as undo_exc:  # never out of the program's import
                    message += f"; taking its changes back failed too ({undo_exc})"
                log.error("%s", message)
                warnings.warn(message, RuntimeWarning, stacklevel=2)

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

    def call(self, change: Callable[[], None], undo: Callable[[], None], label: str) -> None:
        """Run ``change()`` now and ``undo()`` when the patches are undone: a change that is no
        attribute or item (dynamo's strategy for a code object)."""
        change()
        self._log.append(("call", undo, label, None))

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
        still holds ``original``: the modules that took a function by name at import.

        A module imported while the replacement is in place takes it by name; :meth:`undo`
        gives every module in ``sys.modules`` that holds it as ``name`` the original back."""
        self._rebound.append((name, original, replacement))
        for owner in owners:
            if getattr(owner, name, None) is original:
                self.setattr(owner, name, replacement)

    def wrap_arguments(self, owner: Any, name: str, edit: Callable[[dict], None]) -> Callable:
        """Replace ``owner.name`` by :func:`with_edited_arguments` of it; returns the original."""
        return self.wrap(owner, name, lambda original: with_edited_arguments(original, edit))

    def undo(self) -> None:
        """Stop waiting for imports, then restore every recorded change, newest first; a change
        that cannot be restored does not stop the others (RuntimeError listing those that
        failed, at the end)."""
        with self._lock:
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
            rebound, self._rebound = self._rebound, []
            try:
                self._undo_to(0)
            finally:
                _unbind(rebound)

    def _undo_to(self, mark: int) -> None:
        failed = []
        while len(self._log) > mark:
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


def _unbind(rebound: List[Tuple[str, Any, Any]]) -> None:
    """Give every imported module that holds a replacement as ``name`` its original back."""
    if not rebound:
        return
    for module in list(sys.modules.values()):
        namespace = getattr(module, "__dict__", None)
        if not isinstance(namespace, dict):
            continue
        for name, original, replacement in rebound:
            if namespace.get(name) is replacement:
                namespace[name] = original


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
    elif kind == "call":
        owner()
    else:
        owner.__class__ = old


class _GeneratorMeta(type):
    """Keeps ``isinstance(g, torch.Generator)`` true for every real generator."""

    def __instancecheck__(cls, instance):
        import torch

        return isinstance(instance, torch._C.Generator)

    def __subclasscheck__(cls, subclass):
        import torch

        return issubclass(subclass, torch._C.Generator)


def generator_class(original: type, new: Callable[..., Any]) -> type:
    """A stand-in for ``torch.Generator`` whose construction is ``new(device="cpu")``: named and
    documented as ``original``, and every real generator still an instance of it."""

    class Generator(metaclass=_GeneratorMeta):
        __doc__ = original.__doc__

        def __new__(cls, device="cpu"):
            return new(device)

    Generator.__module__ = "torch"
    Generator.__qualname__ = Generator.__name__ = "Generator"
    return Generator
