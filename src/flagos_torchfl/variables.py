"""Every ``FL_*`` environment variable the package reads, declared once: its name, its parser,
its default and a one-line description. Code reads a variable only through :func:`read` (or
:func:`raw`), so the README's table (:func:`markdown_table`) and the ``env`` report cannot drift
from what the code does.

Parsers take the stripped, non-empty text and return the value or raise
:class:`~flagos_torchfl.errors.ConfigError` naming the variable, the value and the valid forms.
Values whose meaning belongs to a layer above (backend names, operator names, routes) are
declared here as text and interpreted by that layer.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import warnings
from typing import Any, Callable, Dict, Mapping, MutableMapping, Optional, Tuple

from . import config
from .errors import ConfigError, suggestion
from .log import parse_level

#: the largest device count a logical-device variable accepts (torch's device index is an int8)
MAX_DEVICES = 128
#: the longest probe timeout accepted, in seconds
MAX_PROBE_TIMEOUT = 3600.0


@dataclasses.dataclass(frozen=True)
class Variable:
    """One environment variable. ``internal`` ones are set by the launcher for its children."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    internal: bool = False

    def read(self, environ: Mapping[str, str] = os.environ) -> Any:
        """The parsed value, or the default when the variable is unset or blank."""
        text = environ.get(self.name, "").strip()
        return self.parse(text) if text else self.default


def _text(text: str) -> str:
    return text


def _flag(text: str) -> bool:
    return text == "1"


def _device_count(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_DEVICES:
            raise ConfigError(f"{name}={text!r} is not valid: give a number of devices from 1 to {MAX_DEVICES}")
        return int(text)

    return parse


def _choice(name: str, choices: Tuple[str, ...], renamed: Optional[Dict[str, str]] = None) -> Callable[[str], str]:
    """A parser of one of ``choices``; ``renamed``: former names -> their choice, accepted with a
    FutureWarning saying the new name."""
    def parse(text: str) -> str:
        value = text.lower()
        if renamed and value in renamed:
            warnings.warn(f"{name}={text} is deprecated: say {name}={renamed[value]}", FutureWarning, stacklevel=2)
            return renamed[value]
        if value not in choices:
            raise ConfigError(f"{name}={text!r} is not valid.{suggestion(value, choices)} Valid: {', '.join(choices)}")
        return value

    return parse


def _packages(name: str) -> Callable[[str], Tuple[str, ...]]:
    def parse(text: str) -> Tuple[str, ...]:
        items = tuple(part.strip() for part in text.split(",") if part.strip())
        bad = [item for item in items if not item.isidentifier()]
        if bad or not items:
            raise ConfigError(f"{name}={text!r} is not valid: give top-level package names separated by commas")
        return items

    return parse


def _device_memory(text: str) -> int:
    found = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]*)", text.replace(" ", ""))
    scale = config.UNITS.get((found.group(2) or "b").lower()) if found else None
    size = int(float(found.group(1)) * scale) if scale else 0
    if size < config.MIB:
        raise ConfigError(f"FL_SIM_DEVICE_MEMORY={text!r} is not valid: give bytes per device, at least "
                          "1 MiB, e.g. `64GiB`, `48GB`, `1073741824`")
    return size


def _report(text: str) -> str:
    value = {"1": "text", "text": "text", "json": "json"}.get(text.lower())
    if value is None:
        raise ConfigError(f"FL_RUN_REPORT={text!r} is not valid: `1` (text) or `json`")
    return value


def _probe_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (0 < value <= MAX_PROBE_TIMEOUT):
        raise ConfigError(f"FL_PROBE_TIMEOUT={text!r} is not valid: give seconds, a number in (0, {MAX_PROBE_TIMEOUT:g}]")
    return value


_DECLARED = (
    Variable("FL_BACKEND", _text, None,
             "backend name or ordered list (`ascend,cuda,cpu`: the first available); wins over code"),
    Variable("FL_GPU_IDS", config.parse_gpu_ids, None, "the `gpu_ids` setting, e.g. `0,1`"),
    Variable("FL_MEMORY_VIRTUAL_LIMIT", config.parse_memory_limit, None,
             "the `memory_virtual_limit` setting, e.g. `40GiB`, `50%`"),
    Variable("FL_MEMORY_POOL_CLEAR_INTERVAL", config.parse_clear_interval, None,
             "the `memory_pool_clear_interval` setting (optimizer steps)"),
    Variable("FL_MIXED_PRECISION", lambda text: config.parse_bool("FL_MIXED_PRECISION", text), None,
             "the `enable_mixed_precision` setting (`1`/`0`)"),
    Variable("FL_DEVICES", _device_count("FL_DEVICES"), None,
             "devices to use (`run --devices N`): `cpu`/`sim` present N, other backends use their first N"),
    Variable("FL_EXPANDABLE_SEGMENTS", lambda text: config.parse_bool("FL_EXPANDABLE_SEGMENTS", text), False,
             "`1`: the chip's allocator grows segments instead of fragmenting (`expandable_segments:True` "
             "in `PYTORCH_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF`, on cuda/rocm; `PYTORCH_NPU_ALLOC_CONF` on ascend)"),
    Variable("FL_CPU_DEVICES", _device_count("FL_CPU_DEVICES"), None,
             "logical devices the `cpu` backend presents (default `LOCAL_WORLD_SIZE`, else 1)"),
    Variable("FL_SIM_DEVICES", _device_count("FL_SIM_DEVICES"), None,
             "devices of the `sim` backend (default `LOCAL_WORLD_SIZE`, else 1)"),
    Variable("FL_SIM_NATIVE_OPS", _text, None,
             "the operators `sim` runs natively: names, categories, or a file `ops --export` wrote"),
    Variable("FL_SIM_PROFILE", _text, None,
             "make `sim` answer as a chip: `ascend`, `cambricon` or `mthreads` (its operator table and traits), "
             "or one model of it, e.g. `ascend:910a`"),
    Variable("FL_SIM_DEVICE_MEMORY", _device_memory, None,
             "memory per `sim` device, e.g. `64GiB` (default: the profile's chip, else 16 GiB)"),
    Variable("FL_SIM_RUNTIME", _choice("FL_SIM_RUNTIME", ("auto", "cpp", "python"), renamed={"native": "cpp"}),
             "auto",
             "`sim`'s device runtime: `cpp` (its C++ runtime, built at first use with the machine's C++ "
             "compiler; `native`, its former name, still works), `python` (its Python guard: fewer of "
             "PyTorch's questions answered), `auto` (cpp where it can be built, else python with a warning)"),
    Variable("FL_FALLBACK_BUDGET", _text, None,
             "fail the run when host fallbacks exceed a count (`10`) or a share of operator time "
             "(`5%`); `:strict` (or `strict` alone, for none) fails at the first violation"),
    Variable("FL_OP_ROUTE", _text, None, "per-operator routes, e.g. `softmax=cpu,gelu=composite`"),
    Variable("FL_ROUTING_CONFIG", _text, None, "a JSON or TOML file of per-operator routes"),
    Variable("FL_ROUTING_REGISTRATION", _choice("FL_ROUTING_REGISTRATION", ("auto", "per-op")), "auto",
             "`auto` (one backend fallback where possible) or `per-op` (a kernel per operator)"),
    Variable("FL_FP32_OPS", _text, None, "operators that run in float32 under autocast, e.g. `softmax,layer_norm`"),
    Variable("FL_CHECK_FINITE", lambda text: config.parse_bool("FL_CHECK_FINITE", text), False,
             "`1`: raise at the first operator whose output holds NaN/Inf"),
    Variable("FL_CUDA_KERNEL_PACKAGES", _packages("FL_CUDA_KERNEL_PACKAGES"), (),
             "more packages told `torch.cuda.is_available()` is False (they load CUDA kernels otherwise)"),
    Variable("FL_PROBE_TIMEOUT", _probe_timeout, 10.0,
             "seconds allowed to each vendor query tool and plugin import (default 10)"),
    Variable("FL_LOG_LEVEL", parse_level, None, "`DEBUG`, `INFO` (shows decisions), `WARNING` (default), ..."),
    Variable("FL_ACTIVATE", _flag, False, "`1`: the start-up hook activates this process", internal=True),
    Variable("FL_BACKEND_FROM_LAUNCHER", _flag, False, "`1`: FL_BACKEND came from `run --backend`",
             internal=True),
    Variable("FL_RUN_REPORT", _report, None,
             "`1`: print the routing report at exit (`run --report`), `json`: as JSON (`--json`)",
             internal=True),
    Variable("FL_PARENT_ACTIVATION", _text, None,
             "the activation of the parent process under `run` (JSON), which its children reuse",
             internal=True),
    Variable("FL_PLUGIN_AUTOLOAD", _text, None,
             "which device plugins this interpreter's torch could not auto-load, and why (JSON); set "
             "with `TORCH_DEVICE_BACKEND_AUTOLOAD=0` when one failed", internal=True),
    Variable("FL_VISIBLE_DEVICES_TRANSLATED", _text, None,
             "vendor mask variables set from `CUDA_VISIBLE_DEVICES` (`NAME=VALUE;...`)", internal=True),
    Variable("FL_ENVIRONMENT_TRANSLATED", _text, None,
             "the chip's variables set from NVIDIA's (`NAME=VALUE;...`, data/cuda_environment.json)", internal=True),
)
VARIABLES: Dict[str, Variable] = {v.name: v for v in _DECLARED}


def variable(name: str) -> Variable:
    """The declaration of ``name``; ConfigError with the closest name for an undeclared one."""
    try:
        return VARIABLES[name]
    except KeyError:
        raise ConfigError(f"{name} is not a flagos_torchfl variable.{suggestion(name, VARIABLES)}") from None


def read(name: str, environ: Mapping[str, str] = os.environ) -> Any:
    """The parsed value of variable ``name`` (its default when unset)."""
    return variable(name).read(environ)


def validate(environ: Mapping[str, str] = os.environ) -> None:
    """Parse every declared variable that is set; raises the first ConfigError (a bad value is
    rejected even when the backend chosen would not read it)."""
    for declared in _DECLARED:
        declared.read(environ)


def raw(name: str, environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The stripped text of variable ``name``, or None when it is unset or blank."""
    return environ.get(variable(name).name, "").strip() or None


#: the variable that carries each setting of :data:`config.SETTINGS`
SETTING_VARIABLES = {
    "gpu_ids": "FL_GPU_IDS",
    "memory_virtual_limit": "FL_MEMORY_VIRTUAL_LIMIT",
    "memory_pool_clear_interval": "FL_MEMORY_POOL_CLEAR_INTERVAL",
    "enable_mixed_precision": "FL_MIXED_PRECISION",
}


def assign(environ: MutableMapping[str, str], name: str, value: str) -> None:
    """Set variable ``name`` (it must be declared) to ``value`` in ``environ``."""
    environ[variable(name).name] = value


def restorer(environ: MutableMapping[str, str], names) -> Callable[[], None]:
    """The undo that gives each variable of ``names`` back the value it has in ``environ`` now
    (unset again where it is unset now)."""
    saved = {name: environ.get(name) for name in names}

    def undo() -> None:
        for name, value in saved.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value

    return undo


def settings_from_env(environ: Mapping[str, str] = os.environ) -> Dict[str, Any]:
    """Setting name -> validated value, for each setting an ``FL_*`` variable gives."""
    return {setting: read(name, environ) for setting, name in SETTING_VARIABLES.items()
            if raw(name, environ) is not None}


def markdown_table() -> str:
    """The README's table of the variables users set."""
    lines = ["| variable | meaning |", "|---|---|"]
    lines += [f"| `{v.name}` | {v.doc} |" for v in _DECLARED if not v.internal]
    return "\n".join(lines)
