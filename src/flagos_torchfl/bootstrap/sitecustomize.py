"""Start-up hook of every Python process started under ``python -m flagos_torchfl run``.

The launcher puts this folder at the front of ``PYTHONPATH`` and sets ``FL_ACTIVATE=1``; child
interpreters inherit both, so Python's ``site`` module runs this file at start-up. It then:

- installs an import watcher that activates the backend (``flagos_torchfl.startup.activate``)
  right after ``torch`` has finished importing, before the program's next line can use it. A
  process that never imports torch never imports flagos_torchfl: it pays for this file only;
- runs the ``sitecustomize`` this file shadows, if there is one further along ``sys.path``.

Python prints and then ignores errors raised by start-up hooks, and activation happens inside an
``import torch`` that the program may guard with ``except``; so a failed activation is never
raised: it prints ``flagos_torchfl: cannot activate backend ...`` and ends the process with
exit code 1, rather than letting it run on the wrong device. An interpreter that has torch but
not this package runs unactivated with one warning, unless ``FL_BACKEND`` asks for a backend
(then it ends with exit code 1, saying the package is missing there).

Before torch is first imported it runs the package's ``autoload.guard`` (loaded by path), so that a
vendor plugin that cannot load does not take ``import torch`` down (see ``flagos_torchfl/autoload.py``).

Standard library only, and nothing imported that start-up has not loaded already.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
#: importing one of these finishes -> activation, once none of them is still being imported
#: (flagos_torchfl imports torch itself; it must be complete before it is used)
_WATCHED = ("torch", "flagos_torchfl")


def _abort(exc):
    """Say why activation failed and end the process with exit code 1."""
    backend = os.environ.get("FL_BACKEND", "").strip() or "auto"
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    try:
        sys.stderr.write(f"flagos_torchfl: cannot activate backend {backend}: {detail}\n")
        sys.stderr.flush()
    finally:
        os._exit(1)


def _activate():
    """Activate the backend the inherited ``FL_*`` environment asks for, or abort. In an
    interpreter that has torch but not this package, see :func:`_package_missing`."""
    try:
        from flagos_torchfl.startup import activate
    except ModuleNotFoundError as exc:
        if exc.name == "flagos_torchfl":
            _package_missing()
            return
        _abort(exc)
    except BaseException as exc:
        _abort(exc)
    try:
        activate()
    except BaseException as exc:  # even SystemExit: the process must not go on unactivated
        _abort(exc)


def _package_missing():
    """A foreign interpreter (an evaluation venv, a tool's own environment) imported torch but
    cannot import flagos_torchfl. With ``FL_BACKEND`` set, a backend was asked for explicitly:
    end the process with exit code 1, saying the package is missing there. Otherwise run it
    unactivated, with one warning on stderr."""
    backend = os.environ.get("FL_BACKEND", "").strip()
    where = f"this Python interpreter ({sys.executable})"
    if backend:
        _abort(ModuleNotFoundError(
            f"flagos_torchfl is not installed in {where}, which FL_BACKEND={backend} asks to "
            "activate; install flagos_torchfl there, or unset FL_BACKEND for this program"))
    try:
        sys.stderr.write(f"flagos_torchfl: warning: not installed in {where}; this process runs "
                         "with torch unchanged (no backend activated)\n")
        sys.stderr.flush()
    except Exception:
        pass


def _guard_plugins():
    """Before torch is imported: the package's ``autoload.guard`` (a vendor plugin that cannot
    load must not take ``import torch`` down), loaded by path so that the package, which imports
    torch, is not imported yet. Once per process; the parent's record makes it cheap. Should the
    guard itself fail, one line on stderr says so and torch imports as it would without it."""
    global _guarded
    if _guarded:
        return
    _guarded = True
    path = os.path.join(os.path.dirname(_HERE), "autoload.py")
    try:
        from importlib.util import module_from_spec, spec_from_file_location

        spec = spec_from_file_location("_flagos_torchfl_autoload", path)
        module = module_from_spec(spec)
        spec.loader.exec_module(module)
        module.guard()
    except Exception as exc:
        detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        try:
            sys.stderr.write(f"flagos_torchfl: warning: the device-plugin check failed ({detail}); "
                             "torch loads its plugins unchecked\n")
            sys.stderr.flush()
        except Exception:
            pass


_guarded = False


def _restore_loader(module, loader):
    module.__loader__ = loader
    spec = getattr(module, "__spec__", None)
    if spec is not None:
        spec.loader = loader


class _WatchedLoader:
    """Delegates to the real loader; tells the watcher when the module has finished executing."""

    def __init__(self, loader, name, watcher):
        self._loader, self._name, self._watcher = loader, name, watcher

    def __getattr__(self, attr):
        return getattr(self._loader, attr)

    def exec_module(self, module):
        self._watcher.loading.add(self._name)
        try:
            self._loader.exec_module(module)
        finally:
            self._watcher.loading.discard(self._name)
            _restore_loader(module, self._loader)
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            # the module has run: other threads (a probe importing a vendor plugin, which
            # imports torch) may use it now instead of waiting for this import to return
            spec._initializing = False
        self._watcher.finished()


class _ImportWatcher:
    """A ``sys.meta_path`` finder that answers only for the watched names: it finds them through
    the other finders and wraps their loader. Every other import passes through untouched."""

    def __init__(self):
        self.loading = set()
        self._finding = set()
        self._done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _WATCHED or fullname in self._finding or self._done:
            return None
        if fullname == "torch" and "torch" not in sys.modules:
            _guard_plugins()
        self._finding.add(fullname)
        try:
            spec = self._find_elsewhere(fullname, path, target)
        finally:
            self._finding.discard(fullname)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _WatchedLoader(spec.loader, fullname, self)
        return spec

    def _find_elsewhere(self, fullname, path, target):
        for finder in list(sys.meta_path):
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def finished(self):
        """Activate once torch is imported and no watched module is half-way through importing."""
        if self._done or self.loading or "torch" not in sys.modules:
            return
        self._done = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _activate()


def _run_shadowed_sitecustomize():
    """Run the next ``sitecustomize`` on ``sys.path`` (the one Python would have run)."""
    from importlib.machinery import PathFinder

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _install():
    """Watch imports only in processes the launcher asked to activate (``FL_ACTIVATE=1``)."""
    if os.environ.get("FL_ACTIVATE") == "1":
        sys.meta_path.insert(0, _ImportWatcher())


_install()
_run_shadowed_sitecustomize()
