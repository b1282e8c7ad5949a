"""``run``: start a program with the backend layer active, with no change to the program.

    python -m flagos_torchfl run [--backend NAME | --profile CHIP] [--log-level LEVEL]
                                 [--report [--json]] script.py ARGS
    python -m flagos_torchfl run [OPTIONS] -m package.module ARGS
    python -m flagos_torchfl run [OPTIONS] [--] command ARGS    (torchrun, python other.py, ...)

What follows the launcher's own options is one of:

- ``-m MODULE``: run the module as ``python -m MODULE`` would, in this process;
- a script: a path ending in ``.py``, ``.pyw`` or ``.pyz``, a directory or an existing file
  that is not executable. It runs in this process as ``python script.py`` would;
- anything else is a command, looked up on ``PATH`` and executed in place of this process
  (``--`` may separate it from the launcher's options).

A script or module runs with the backend activated before its first line; ``sys.argv``,
``sys.path[0]`` and ``__name__ == "__main__"`` are as with ``python``, except that
``sys.argv[0]`` is the script's absolute path (as ``__file__`` is). Its exit code is passed
through: ``sys.exit(n)`` gives ``n``, an uncaught exception prints its traceback and gives 1
(an uncaught ``torch.OutOfMemoryError`` with a note: the pool figures and what to change).
A command's exit code is its own. Every Python child activates when it imports torch (see
:mod:`flagos_torchfl.startup`). Usage errors (a missing script, module or command included)
exit with 2, an activation failure with 1, a command that cannot be started with 126, a run
over its ``FL_FALLBACK_BUDGET`` with 3.

``--profile CHIP[:MODEL]`` runs on the sim answering as that chip (``FL_SIM_PROFILE``); ``--report``
prints, at exit, the routing report ending with the verdict, ``--json`` the verdict as JSON.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import runpy
import shutil
import sys
import zipfile
from importlib.machinery import PathFinder
from typing import List, Optional, Union

from .. import compat, startup, variables
from ..api import current_backend, deactivate
from ..errors import ConfigError, UnknownBackendError
from ..log import LEVELS, get_logger, level_from_env, parse_level
from ..selection import parse_backend_list

log = get_logger("launcher")
SCRIPT_SUFFIXES = (".py", ".pyw", ".pyz")
#: frames of these files are left out of the traceback of a program's uncaught exception
_LAUNCHER_FILES = {__file__, runpy.run_path.__code__.co_filename}


class UsageError(Exception):
    """The command line cannot be run as given (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Script:
    path: str
    args: List[str]


@dataclasses.dataclass(frozen=True)
class Module:
    name: str
    args: List[str]


@dataclasses.dataclass(frozen=True)
class Command:
    executable: str
    argv: List[str]


Target = Union[Script, Module, Command]


def add_parser(sub) -> None:
    p = sub.add_parser(
        "run", help="run a script, module or command with the backend active in it and its children",
        usage="%(prog)s [--backend NAME | --profile CHIP] [--devices N] [--log-level LEVEL] [--report] [--json] "
              "(script.py | -m module | [--] command) [args ...]",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--backend", metavar="NAME",
                   help="backend to use, or a comma-separated list tried in order; wins over "
                        "FL_BACKEND and init_backend(backend=...) in the program")
    p.add_argument("--devices", metavar="N",
                   help="use N devices: cpu and sim present N logical devices, other backends use "
                        "their first N (sets FL_DEVICES for the program and its children)")
    p.add_argument("--log-level", metavar="LEVEL", help=f"FL_LOG_LEVEL for the program: {', '.join(LEVELS)}")
    p.add_argument("--profile", metavar="CHIP[:MODEL]",
                   help="run on the sim answering as CHIP (ascend, cambricon, mthreads), or one model of "
                        "it (ascend:910a): its operator table and traits (FL_SIM_PROFILE)")
    p.add_argument("--report", action="store_true",
                   help="print the routing report and the verdict when the program exits")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON when the program exits")
    p.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE",
                   help="run a module as `python -m` does; the rest of the line is its arguments")
    p.add_argument("program", nargs=argparse.REMAINDER,
                   help="script.py or command, then its arguments")
    p.set_defaults(func=run)


def run(args) -> int:
    """Validate, prepare the environment, then run the target; returns its exit code."""
    try:
        target = parse_target(args.module, args.program)
        backends = validate_backend(args.backend)
        profile = validate_profile(args.profile, backends)
        level = validate_log_level(args.log_level)
        devices = validate_devices(args.devices)
    except UsageError as exc:
        print(f"flagos-torchfl run: error: {exc}", file=sys.stderr)
        return 2
    if profile:
        backends = ["sim"]
    report = "json" if args.json else args.report
    startup.prepare_environment(os.environ, backends, level, report, profile, devices)
    if level:
        get_logger().setLevel(level_from_env())
    if isinstance(target, Command):
        return exec_command(target)
    if not activate_here():
        return 1
    if isinstance(target, Script):
        return run_script(target)
    return run_module(target)


def parse_target(module: Optional[List[str]], program: List[str]) -> Target:
    """What to run, from ``-m ...`` or the positional words; raises UsageError."""
    if module is not None:
        if not module:
            raise UsageError("-m needs a module name, e.g. `run -m package.module`")
        check_module_exists(module[0])
        return Module(module[0], module[1:])
    if program[:1] == ["--"]:
        program = program[1:]
    if not program:
        raise UsageError("nothing to run: give a script (train.py), -m module, or a command (torchrun ...)")
    first, rest = program[0], program[1:]
    if is_script(first):
        if not os.path.exists(first):
            raise UsageError(f"cannot open script {first!r}: no such file or directory")
        return Script(first, rest)
    executable = shutil.which(first)
    if executable is None:
        raise UsageError(f"{first!r} is neither a Python script (*.py) nor a command found on PATH")
    return Command(executable, program)


def is_script(word: str) -> bool:
    """True for what runs in this process as a script: ``*.py``/``*.pyw``/``*.pyz``, a
    directory, or an existing file without execute permission (``python FILE`` accepts it)."""
    if word.endswith(SCRIPT_SUFFIXES) or os.path.isdir(word):
        return True
    return os.path.isfile(word) and not os.access(word, os.X_OK)


def check_module_exists(name: str) -> None:
    """Raise UsageError when the top-level package of ``name`` is neither importable nor in the
    current directory (which ``python -m`` searches first). Only the top level is checked:
    finding ``a.b`` would import ``a`` before the backend is active."""
    top = name.split(".")[0]
    if top and (importlib.util.find_spec(top) or PathFinder.find_spec(top, [os.getcwd()])):
        return
    raise UsageError(f"no module named {top!r} (for -m {name})")


def validate_backend(value: Optional[str]) -> Optional[List[str]]:
    """Canonical backend names for ``--backend`` (None when not given); raises UsageError
    naming the closest valid name."""
    if value is None:
        return None
    try:
        return parse_backend_list(value, "--backend")
    except (UnknownBackendError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def validate_profile(value: Optional[str], backends: Optional[List[str]]) -> Optional[str]:
    """The profile name for ``--profile`` (None when not given); raises UsageError for an
    unknown one (naming the valid ones) or beside a ``--backend`` other than sim."""
    if value is None:
        return None
    from ..tables.profile_specs import check_profile

    if backends not in (None, ["sim"]):
        raise UsageError(f"--profile runs the program on the sim; it cannot be combined with "
                         f"--backend {','.join(backends)}")
    try:
        return check_profile(value.strip().lower(), "--profile")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def validate_log_level(value: Optional[str]) -> Optional[str]:
    """The level name (or number) for ``--log-level``; raises UsageError for anything else."""
    if value is None:
        return None
    try:
        return parse_level(value, "--log-level")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def validate_devices(value: Optional[str]) -> Optional[int]:
    """The device count for ``--devices`` (None when not given); raises UsageError."""
    if value is None:
        return None
    try:
        return variables.variable("FL_DEVICES").parse(value.strip())
    except ConfigError as exc:
        raise UsageError(str(exc).replace("FL_DEVICES=", "--devices ")) from None


def exec_command(command: Command) -> int:
    """Replace this process by the command, with the prepared environment (never returns
    unless the command cannot be started: then 126 with the reason)."""
    log.debug("exec %s", command.argv)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execve(command.executable, command.argv, os.environ)
    except OSError as exc:
        print(f"flagos-torchfl run: error: cannot run {command.argv[0]!r}: {exc}", file=sys.stderr)
        return 126


def activate_here() -> bool:
    """Activate the backend in this process before the program's first line; on failure print
    why and return False. An activation made by a parent launcher's start-up hook (nested
    launcher) is replaced by this launcher's choice."""
    if current_backend() is not None:
        deactivate()
    try:
        startup.activate()
    except Exception as exc:
        print(startup.failure_message(exc), file=sys.stderr)
        return False
    return True


def run_script(script: Script) -> int:
    """Run a script as ``__main__`` the way ``python script.py`` does."""
    path = os.path.abspath(script.path)
    sys.argv = [path, *script.args]
    if os.path.isdir(path) or zipfile.is_zipfile(path):
        if not getattr(sys.flags, "safe_path", False):
            del sys.path[0]  # run_path puts the directory or archive there itself
    else:
        set_path0(os.path.dirname(os.path.realpath(path)))
    return run_main(lambda: runpy.run_path(path, run_name="__main__"))


def run_module(module: Module) -> int:
    """Run a module as ``__main__`` the way ``python -m module`` does."""
    sys.argv = ["-m", *module.args]
    set_path0(os.getcwd())
    return run_main(lambda: runpy.run_module(module.name, run_name="__main__", alter_sys=True))


def set_path0(folder: str) -> None:
    """Make ``folder`` the first import location, as Python does for the main program (not at
    all under ``-P``/``-I``, which leave it out)."""
    if not getattr(sys.flags, "safe_path", False):
        sys.path[0] = folder


def _is_out_of_memory(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(exc, compat.out_of_memory_error())


def run_main(main) -> int:
    """Run ``main``; 0 when it returns, 1 with the traceback printed for an uncaught exception.
    ``SystemExit`` and ``KeyboardInterrupt`` propagate so Python ends as it would."""
    try:
        main()
    except Exception:
        exc_type, exc, tb = sys.exc_info()
        if _is_out_of_memory(exc):
            from ..memory import add_oom_note

            add_oom_note(exc)
        while tb is not None and tb.tb_frame.f_code.co_filename in _LAUNCHER_FILES:
            tb = tb.tb_next
        sys.excepthook(exc_type, exc.with_traceback(tb), tb)
        return 1
    return 0
