"""Per-operator route overrides: ``FL_OP_ROUTE="softmax=cpu,gelu=composite"`` and routing
config files (``ft.load_routing_config(path)`` or ``FL_ROUTING_CONFIG=path``).

Names go through the semantic name table (``softmax``, ``LayerNorm``, a category, or an ATen
operator). ``cpu`` is accepted for ``fallback``. A config file is JSON (``{"routes": {"softmax":
"cpu"}}``) or TOML (``[routes]`` then ``softmax = "cpu"``). ``FL_OP_ROUTE`` wins over a file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Dict, Mapping, Tuple

from .. import variables
from ..errors import ConfigError, suggestion
from ..aten import names

ROUTES = ("native", "library", "composite", "fallback", "unsupported")
ALIASES = {"cpu": "fallback"}

#: overload -> (route, the entry as written ("softmax=cpu"), where it came from)
Overrides = Dict[str, Tuple[str, str, str]]


def parse_route(value: str, where: str) -> str:
    """A route name (``cpu`` means ``fallback``); ConfigError naming the valid ones otherwise."""
    route = str(value).strip().lower()
    route = ALIASES.get(route, route)
    if route not in ROUTES:
        valid = [*ROUTES, *ALIASES]
        raise ConfigError(
            f"{where}: unknown route {value!r}.{suggestion(str(value).strip().lower(), valid)} "
            f"Valid routes: {', '.join(ROUTES)} (cpu = fallback)"
        )
    return route


def expand(entries: Mapping[str, str], where: str) -> Overrides:
    """Resolve ``{name: route}`` to overloads; an unknown name is a ConfigError with the
    closest matches."""
    result: Overrides = {}
    for name, value in entries.items():
        route = parse_route(value, f"{where} entry {name}={value}")
        try:
            ops = names.resolve(name)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        for op in ops:
            result[op] = (route, f"{name}={value}", where)
    return result


def parse_spec(text: str, where: str = "FL_OP_ROUTE") -> Overrides:
    """``"softmax=cpu,gelu=composite"`` (``,`` or ``;`` between entries) -> overrides."""
    entries: Dict[str, str] = {}
    for item in text.replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        name, eq, route = item.partition("=")
        if not eq or not name.strip() or not route.strip():
            raise ConfigError(
                f"{where}: {item!r} is not NAME=ROUTE (e.g. softmax=cpu,gelu=composite); "
                f"routes: {', '.join(ROUTES)}"
            )
        entries[name.strip()] = route.strip()
    return expand(entries, where)


def load_file(path) -> Overrides:
    """Read a routing config file (JSON, or TOML where ``tomllib`` exists); ConfigError naming
    the file for a missing file, a directory, a file that is not UTF-8 text or bad content."""
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ConfigError(f"routing config path {path!r} is not valid: give the path of a JSON or TOML file")
    p = Path(path)
    where = f"routing config {str(p)!r}"
    text = read_text_file(p, where)
    if p.suffix.lower() == ".toml":
        try:
            import tomllib
        except ImportError:  # Python < 3.11
            raise ConfigError(f"{where}: TOML needs Python 3.11+; use a JSON file") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{where} is not valid TOML: {exc}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("routes"), dict):
        raise ConfigError(f"{where} must hold a 'routes' table of NAME = ROUTE entries")
    unknown = sorted(set(data) - {"routes"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; the only key is 'routes'")
    return expand(data["routes"], where)


def read_text_file(path, where: str) -> str:
    """The UTF-8 text of ``path``; ConfigError starting with ``where`` when it is missing, a
    directory, unreadable or not UTF-8."""
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"{where} is a directory, not a file")
    if not p.exists():
        raise ConfigError(f"{where} does not exist")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{where} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror or exc}") from None


def from_env(environ: Mapping[str, str] = os.environ) -> Overrides:
    """Overrides from ``FL_ROUTING_CONFIG`` (a file) overlaid by ``FL_OP_ROUTE``."""
    result: Overrides = {}
    config = variables.read("FL_ROUTING_CONFIG", environ)
    if config:
        result.update(load_file(config))
    spec = variables.read("FL_OP_ROUTE", environ)
    if spec:
        result.update(parse_spec(spec))
    return result
