"""torch's auto-load of device plugins, checked before torch is imported.

torch (2.5 and later) loads every ``torch.backends`` entry point at ``import torch``; a vendor
plugin that cannot load (torch_npu without the CANN toolkit) takes torch down with it. Where this
package starts an interpreter — its command line and the processes the launcher starts
(``bootstrap/sitecustomize.py``) — :func:`guard` runs first: it loads the plugins in a child
interpreter (bounded by ``FL_PROBE_TIMEOUT``), and when one fails it sets
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` so torch imports without them, and records why each failed in
the internal variable ``FL_PLUGIN_AUTOLOAD``. Children inherit both and probe nothing again (a child with another
interpreter or ``LD_LIBRARY_PATH`` probes afresh). A load that only timed out is recorded as
such, not as a failure: the backend's own bounded import tries it once. A
``TORCH_DEVICE_BACKEND_AUTOLOAD`` the user set is left as it is, and nothing is probed then.
Where no plugin is installed the record says so too, so that children do not scan the installed
distributions again (about 50 to 90 ms each here).

The reasons say what is wrong and what fixes it: the missing shared library, the vendor component
that ships it (``data/plugin_libraries.json``) with the state of the variables that make it
visible, and a plugin built for another torch (its own ``Requires-Dist``). Backends read them
through :func:`plugin_problem`; :func:`explain_import` turns an import error met in this process
into the same kind of reason.

Standard library only, and importable without torch: the start-up hook loads this file by path.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from importlib import metadata
from typing import Dict, List, Mapping, MutableMapping, Optional, Set, Tuple

#: torch's switch for the auto-load (read at ``import torch``)
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: the internal variable holding what :func:`guard` found (JSON)
RECORD = "FL_PLUGIN_AUTOLOAD"
GROUP = "torch.backends"
DEFAULT_TIMEOUT = 10.0
_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "plugin_libraries.json")
_MISSING_LIBRARY = re.compile(r"(lib[\w.+\-]*?\.so)(?:\.[\d.]+)?: cannot open shared object file")

#: what the child interpreter runs: import torch without auto-load, then load and call each
#: plugin's entry point as torch would, each bounded by the timeout (argv[1]) through a watchdog
#: that reports the hang and ends the child; prints one JSON line: {"errors": entry point -> error
#: or None, "timed_out": the entry points whose load did not finish}
_PROBE = r"""
import json, os, sys, threading
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
timeout, result, timed_out = float(sys.argv[1]), {}, []

def report():
    sys.stdout.write("\n" + json.dumps({"errors": result, "timed_out": timed_out}) + "\n")
    sys.stdout.flush()

try:
    import torch
except BaseException as exc:
    result[""] = "importing torch failed: %s: %s" % (type(exc).__name__, exc)
else:
    from importlib.metadata import entry_points
    for ep in entry_points(group="torch.backends"):
        def hung(name=ep.name):
            result[name] = "loading %s did not finish within %g s (FL_PROBE_TIMEOUT)" % (name, timeout)
            timed_out.append(name)
            report()
            os._exit(0)
        watchdog = threading.Timer(timeout, hung)
        watchdog.daemon = True
        watchdog.start()
        try:
            ep.load()()
            result[ep.name] = None
        except BaseException as exc:
            cause = exc.__cause__ or exc
            result[ep.name] = "%s: %s" % (type(cause).__name__, cause)
        watchdog.cancel()
report()
"""
#: seconds the probe child may take to import torch itself, besides the plugins' timeouts
TORCH_IMPORT_ALLOWANCE = 300.0


def plugin_entry_points() -> List[Dict[str, Optional[str]]]:
    """The installed ``torch.backends`` entry points: name, module (top-level), distribution and
    its version."""
    found = []
    for ep in metadata.entry_points(group=GROUP):
        dist = getattr(ep, "dist", None)
        found.append({
            "entry_point": ep.name, "module": ep.value.split(":")[0].split(".")[0],
            "dist": dist.metadata["Name"] if dist is not None else None,
            "version": dist.version if dist is not None else None,
        })
    return found


def probe_timeout(environ: Mapping[str, str] = os.environ) -> float:
    """``FL_PROBE_TIMEOUT`` when it is a valid number of seconds, else the default (activation
    rejects a bad value later, with the message of :mod:`flagos_torchfl.variables`)."""
    try:
        value = float(environ.get("FL_PROBE_TIMEOUT", "").strip())
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if 0 < value <= 3600 else DEFAULT_TIMEOUT


def guard(environ: MutableMapping[str, str] = os.environ) -> Optional[dict]:
    """Before torch is imported: make sure a device plugin that cannot load does not take
    ``import torch`` down (see the module docstring). Returns the record (None when there was
    nothing to decide: torch already imported, or the user's own ``TORCH_DEVICE_BACKEND_AUTOLOAD``)."""
    if "torch" in sys.modules:
        return None
    record = _record(environ)
    if record is not None:
        if _current(record, environ):
            return record
        if record.get("disabled"):  # ours, made for another interpreter: decide afresh
            environ.pop(AUTOLOAD, None)
        environ.pop(RECORD, None)
    if AUTOLOAD in environ:
        return None
    plugins = plugin_entry_points()
    errors, timed_out = _probe_plugins(plugins, probe_timeout(environ), environ) if plugins else ({}, set())
    record = {"python": sys.executable, "library_path": environ.get("LD_LIBRARY_PATH", ""),
              "disabled": False, "plugins": {}}
    for plugin in plugins:
        error = errors.get(plugin["entry_point"], errors.get(""))
        reason = explain(plugin["module"], error, plugin["dist"], plugin["version"]) if error else None
        record["plugins"][plugin["module"]] = {
            **plugin, "error": error, "reason": reason,
            "timed_out": bool(error) and (plugin["entry_point"] in timed_out or "" in timed_out)}
        record["disabled"] = record["disabled"] or error is not None
    if record["disabled"]:
        environ[AUTOLOAD] = "0"
    environ[RECORD] = json.dumps(record)
    return record


def _record(environ: Mapping[str, str]) -> Optional[dict]:
    try:
        record = json.loads(environ.get(RECORD) or "null")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _current(record: dict, environ: Mapping[str, str]) -> bool:
    """Whether ``record`` was made for this interpreter and library path (another one may load
    the plugins differently: the guard decides afresh for it)."""
    return (record.get("python") == sys.executable
            and record.get("library_path") == environ.get("LD_LIBRARY_PATH", ""))


def _probe_plugins(plugins: List[dict], timeout: float,
                   environ: Mapping[str, str]) -> Tuple[Dict[str, Optional[str]], Set[str]]:
    """(entry point name -> error text (None: it loaded), the names whose load timed out) from a
    child interpreter, each plugin's load bounded by ``timeout``. A child that does not end in
    time for all of them plus :data:`TORCH_IMPORT_ALLOWANCE` (torch's own import), or dies,
    gives every plugin that error (under the name ``""``); its whole process group is killed,
    also when this process is interrupted while it waits."""
    env = dict(environ)
    env[AUTOLOAD] = "0"
    env.pop("FL_ACTIVATE", None)  # the child must not activate through the start-up hook
    try:
        proc = subprocess.Popen([sys.executable, "-c", _PROBE, repr(timeout)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
    except OSError as exc:
        return {"": f"the plugin probe could not start: {exc}"}, set()
    limit = timeout * len(plugins) + TORCH_IMPORT_ALLOWANCE
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        proc.communicate()
        names = ", ".join(p["entry_point"] for p in plugins)
        return {"": f"importing torch and loading the plugins ({names}) did not finish within {limit:g} s"}, {""}
    except BaseException:  # Ctrl-C while waiting: the probe and whatever it started end too
        _kill_group(proc.pid)
        proc.wait()
        raise
    _kill_group(proc.pid)  # whatever a hung plugin started, once the child has ended
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        found = json.loads(lines[-1])
        return found["errors"], set(found["timed_out"])
    except (IndexError, ValueError, KeyError, TypeError):
        tail = err.decode(errors="replace").strip().splitlines()
        return {"": f"the plugin probe exited with code {proc.returncode}"
                    + (f": {tail[-1][:300]}" if tail else "")}, set()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def plugin_problem(module: str, environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """Why plugin ``module`` could not load in this interpreter, as :func:`guard` recorded it
    (None when it loaded, was not probed, or its load only timed out: that is no verdict, the
    caller's own bounded import decides)."""
    record = _record(environ)
    if record is None or not _current(record, environ):
        return None
    entry = record.get("plugins", {}).get(module) or {}
    return None if entry.get("timed_out") else entry.get("reason")


def disabled_plugins(environ: Mapping[str, str] = os.environ) -> Dict[str, str]:
    """Plugin module -> reason, for the plugins whose failure made :func:`guard` turn torch's
    auto-load off in this interpreter (empty when it did not)."""
    record = _record(environ)
    if record is None or not _current(record, environ) or not record.get("disabled"):
        return {}
    return {m: p["reason"] for m, p in record.get("plugins", {}).items() if p.get("reason")}


# ------------------------------------------------------------------------------ reasons
def explain(module: str, error: str, dist: Optional[str] = None, version: Optional[str] = None) -> str:
    """One paragraph saying why plugin ``module`` failed with ``error`` and what fixes it: a
    torch the plugin was not built for (from its ``Requires-Dist``), the missing shared library
    and the component that ships it, else the error itself."""
    dist, version = _distribution(module, dist, version)
    name = f"{module} {version}" if version else module
    parts = []
    mismatch = torch_mismatch(dist)
    if mismatch:
        required, installed = mismatch
        installed = installed.split("+")[0]
        parts.append(f"{name} requires {required} but torch {installed} is installed: install the {module} "
                     f"release built for torch {installed}, or the torch it asks for")
    library = missing_library(error)
    if library:
        parts.append(f"{name} cannot load: {library} is missing ({error.strip()[:300]}). {ships(module, library)}")
    elif not mismatch:
        parts.append(f"{name} cannot load: {error.strip()[:300]}")
    return "; ".join(parts)


def explain_import(module: str, problem: str) -> str:
    """``problem`` (an import of ``module`` in this process that failed or hung) with what
    :func:`explain` can add: the missing library and its component, a torch mismatch; unchanged
    when there is nothing to add."""
    dist, _ = _distribution(module, None, None)
    if missing_library(problem) is None and torch_mismatch(dist) is None:
        return problem
    return explain(module, problem)


def missing_library(error: Optional[str]) -> Optional[str]:
    """The shared library an ``ImportError`` says it cannot open (``libhccl.so``), or None."""
    found = _MISSING_LIBRARY.search(error or "")
    return found.group(1) if found else None


def ships(module: str, library: str, environ: Mapping[str, str] = os.environ) -> str:
    """Which vendor component ships ``library`` for plugin ``module``, how to make it visible,
    and the state of the variables that do (``data/plugin_libraries.json``)."""
    for component in _components(module):
        if library in component["libraries"]:
            states = [_variable_state(v, component.get("folder"), environ) for v in component["environment"]]
            return (f"It ships with {component['component']}: {component['fix']}. "
                    f"Now: {'; '.join(states)}.")
    return f"No vendor component is known for {library}: check that the libraries {module} needs are on LD_LIBRARY_PATH."


def _variable_state(name: str, folder: Optional[str], environ: Mapping[str, str]) -> str:
    value = environ.get(name, "")
    if not value:
        return f"{name} is not set"
    if name == "LD_LIBRARY_PATH" and folder:
        hits = [p for p in value.split(os.pathsep) if folder.lower() in p.lower()]
        return f"LD_LIBRARY_PATH has {', '.join(hits)}" if hits else f"LD_LIBRARY_PATH has no {folder} folder"
    return f"{name}={value}"


def _components(module: str) -> list:
    try:
        with open(_TABLE, encoding="utf-8") as f:
            return json.load(f)["plugins"].get(module, {}).get("components", [])
    except (OSError, ValueError, KeyError):
        return []


def _distribution(module: str, dist: Optional[str], version: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    if dist is None:
        try:
            found = metadata.distribution(module)
        except metadata.PackageNotFoundError:
            return None, version
        dist, version = found.metadata["Name"], found.version
    return dist, version


def torch_mismatch(dist: Optional[str]) -> Optional[Tuple[str, str]]:
    """(requirement, installed torch version) when distribution ``dist`` requires a torch that
    is not the installed one (``torch==2.14.0.*`` beside torch 2.13.0); None otherwise."""
    if dist is None:
        return None
    try:
        requires = metadata.requires(dist) or []
        installed = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    for line in requires:
        requirement = line.split(";")[0].strip()
        found = re.fullmatch(r"torch\s*(\(?\s*[<>=!~].*?)\)?", requirement)
        if found and not satisfies(installed, found.group(1).strip("( ")):
            return requirement, installed
    return None


def _release(text: str) -> Tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0].split("rc")[0].split("a")[0])[:4])


def satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` meets every clause of a requirement ``spec`` (``==2.13.0.*``,
    ``>=2.4,<2.6``...), compared on release numbers (local labels such as ``+cpu`` ignored)."""
    have = _release(version)
    for clause in spec.split(","):
        found = re.fullmatch(r"\s*(===|==|!=|>=|<=|~=|>|<)\s*([\w.*+\-]+)\s*", clause)
        if not found:
            continue
        op, want = found.groups()
        if want.endswith(".*") and op in ("==", "!="):
            prefix = _release(want[:-2])
            equal = have[:len(prefix)] == prefix
            ok = equal if op == "==" else not equal
        else:
            target = _release(want)
            width = max(len(have), len(target))
            a, b = have + (0,) * (width - len(have)), target + (0,) * (width - len(target))
            ok = {"==": a == b, "===": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b,
                  "<": a < b, "~=": a >= b and a[:max(len(target) - 1, 1)] == b[:max(len(target) - 1, 1)]}[op]
        if not ok:
            return False
    return True


# ------------------------------------------------------------------------------ entry
def started_as_command(argv: Optional[List[str]] = None) -> bool:
    """Whether this interpreter runs the package's command line (``python -m flagos_torchfl``
    or the ``flagos-torchfl`` script), read from the interpreter's own arguments."""
    words = list(getattr(sys, "orig_argv", None) or []) if argv is None else argv
    i = 1
    while i < len(words):
        word = words[i]
        if word == "-m":
            return words[i + 1:i + 2] == ["flagos_torchfl"]
        if word.startswith("-m"):
            return word[2:] == "flagos_torchfl"
        if word == "-c" or not word.startswith("-"):
            break
        i += 2 if word in ("-X", "-W") else 1
    return os.path.basename(sys.argv[0] if sys.argv else "") == "flagos-torchfl"
