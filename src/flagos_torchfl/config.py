"""Validation of every user setting, whichever way it arrives: function argument, ``FL_*``
environment variable (declared in :mod:`.variables`), or a later assignment such as ``ft.memory_pool_clear_interval = 50``.

Each ``parse_*`` function takes the raw value (strings included, as from the environment) and
returns the canonical value or raises :class:`ConfigError` naming the setting, the bad value and
the accepted forms. Nothing here has side effects.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional, Tuple

from .errors import ConfigError

MIB = 1 << 20
UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}
_MEMORY_FORMS = (
    "an int of bytes (at least 1 MiB), a float in (0, 1] (a fraction of device memory), "
    "or a string such as '40GiB', '512MB', '0.5' or '50%'"
)

#: the settings of a backend selection, in ``init_backend``'s order
SETTINGS = ("gpu_ids", "memory_virtual_limit", "memory_pool_clear_interval", "enable_mixed_precision")


@dataclasses.dataclass(frozen=True)
class MemoryLimit:
    """A per-device memory cap: either ``bytes`` or a ``fraction`` of the device's memory."""

    bytes: Optional[int] = None
    fraction: Optional[float] = None

    def resolve(self, device_total: Optional[int]) -> Optional[int]:
        """The cap in bytes for a device with ``device_total`` bytes (None when unknown)."""
        if self.bytes is not None:
            return self.bytes
        if device_total is None:
            return None
        return int(device_total * self.fraction)

    def __str__(self) -> str:
        if self.bytes is not None:
            return format_bytes(self.bytes)
        return f"{self.fraction:g} of device memory"


@dataclasses.dataclass(frozen=True)
class Settings:
    """The validated settings of one backend selection."""

    gpu_ids: Optional[Tuple[int, ...]] = None
    memory_virtual_limit: Optional[MemoryLimit] = None
    memory_pool_clear_interval: Optional[int] = None
    enable_mixed_precision: bool = False


def format_bytes(n: int) -> str:
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} B"


def parse_memory_limit(value: Any) -> Optional[MemoryLimit]:
    """None, bytes (int >= 1 MiB), a fraction (float in (0, 1]) or a string with a unit."""
    if value is None:
        return None
    if isinstance(value, MemoryLimit):
        return value
    if isinstance(value, bool):
        raise ConfigError(f"memory_virtual_limit={value!r} is not valid: give {_MEMORY_FORMS}")
    if isinstance(value, int):
        if value < MIB:
            raise ConfigError(
                f"memory_virtual_limit={value} bytes is below the minimum of 1 MiB ({MIB} bytes); "
                f"give {_MEMORY_FORMS}"
            )
        return MemoryLimit(bytes=value)
    if isinstance(value, float):
        if not 0.0 < value <= 1.0:
            raise ConfigError(
                f"memory_virtual_limit={value} is not a fraction in (0, 1]; give {_MEMORY_FORMS}"
            )
        return MemoryLimit(fraction=value)
    if isinstance(value, str):
        return _parse_memory_string(value)
    raise ConfigError(
        f"memory_virtual_limit has type {type(value).__name__}; give {_MEMORY_FORMS}"
    )


def _parse_memory_string(text: str) -> MemoryLimit:
    """ASCII digits only: ``'４０GiB'`` (full-width digits) is malformed, not 40 GiB."""
    s = text.strip().replace(" ", "")
    if re.fullmatch(r"[0-9]+", s):
        return parse_memory_limit(int(s))
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]*)?)%", s)
    if m:
        return parse_memory_limit(float(m.group(1)) / 100)
    if re.fullmatch(r"[0-9]*\.[0-9]+|[0-9]+\.", s):
        return parse_memory_limit(float(s))
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([A-Za-z]+)", s)
    if m and m.group(2).lower() in UNITS:
        return parse_memory_limit(int(float(m.group(1)) * UNITS[m.group(2).lower()]))
    units = ", ".join(["B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"])
    raise ConfigError(
        f"memory_virtual_limit={text!r} is malformed; give {_MEMORY_FORMS} (units: {units})"
    )


def parse_clear_interval(value: Any) -> Optional[int]:
    """None or a positive number of optimizer steps between memory-pool clears."""
    if value is None:
        return None
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]+\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(
            f"memory_pool_clear_interval={value!r} is not valid: give a positive int "
            "(clear the memory pool every N optimizer steps) or None"
        )
    return value


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_bool(name: str, value: Any) -> bool:
    """A bool, or one of 1/0, true/false, yes/no, on/off (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{name}={value!r} is not valid: give True/False (or 1/0, yes/no, on/off)")


def parse_gpu_ids(value: Any, device_count: Optional[int] = None) -> Optional[Tuple[int, ...]]:
    """None, or a non-empty sequence of distinct device indices below ``device_count``."""
    if value is None:
        return None
    if isinstance(value, str):
        items = [p.strip() for p in value.split(",")]
        if not all(re.fullmatch(r"-?[0-9]+", p) for p in items):
            raise ConfigError(f"gpu_ids={value!r} is not a comma-separated list of integers (e.g. '0,1')")
        value = [int(p) for p in items]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple, range)):
        raise ConfigError(
            f"gpu_ids must be a list of device indices such as [0, 1]; got {type(value).__name__}"
        )
    ids = list(value)
    if not ids:
        raise ConfigError("gpu_ids is empty: give at least one device index, or None for all")
    bad = [i for i in ids if isinstance(i, bool) or not isinstance(i, int)]
    if bad:
        raise ConfigError(f"gpu_ids must hold integers; {bad[0]!r} is a {type(bad[0]).__name__}")
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"gpu_ids {ids} names device(s) {dupes} more than once")
    if device_count is not None:
        out = [i for i in ids if not 0 <= i < device_count]
        if out:
            raise ConfigError(
                f"gpu_ids {ids}: index {out[0]} is out of range; the backend has {device_count} "
                f"device(s), valid indices 0..{device_count - 1}"
            )
    return tuple(ids)


def settings_from(values: Mapping[str, Any]) -> Settings:
    """Validate a mapping of setting name -> raw value into :class:`Settings` (gpu_ids unranged)."""
    unknown = set(values) - set(SETTINGS)
    if unknown:
        from .errors import suggestion

        name = sorted(unknown)[0]
        raise ConfigError(
            f"unknown setting {name!r}.{suggestion(name, SETTINGS)} Valid: {', '.join(SETTINGS)}"
        )
    return Settings(
        gpu_ids=parse_gpu_ids(values.get("gpu_ids")),
        memory_virtual_limit=parse_memory_limit(values.get("memory_virtual_limit")),
        memory_pool_clear_interval=parse_clear_interval(values.get("memory_pool_clear_interval")),
        enable_mixed_precision=parse_bool(
            "enable_mixed_precision", values.get("enable_mixed_precision", False)
        ),
    )
