"""Version checks: the torch this package runs on, and the vendor plugins it drives."""
from __future__ import annotations

import re
import warnings

MIN_TORCH = (2, 4)
#: torch minor versions the test suite has run on (the README's compatibility table).
TESTED_TORCH = ((2, 13),)
#: the pure-Python ``sim`` device needs the PrivateUse1 Python-backend API.
SIM_MIN_TORCH = (2, 9)

_warned: set[str] = set()


def parse_version(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``; unparseable parts end the tuple."""
    parts = []
    for piece in re.split(r"[.+-]", str(text)):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def tested_torch_text() -> str:
    return ", ".join(f"{a}.{b}" for a, b in TESTED_TORCH)


def check_torch(version: str) -> None:
    """Raise for a torch older than the floor; warn once for a version the suite has not run on."""
    v = parse_version(version)[:2]
    if v < MIN_TORCH:
        raise ImportError(
            f"flagos_torchfl needs torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}; found torch {version}"
        )
    if v not in TESTED_TORCH:
        warn_once(
            "torch",
            f"torch {version} is untested with flagos_torchfl (tested: torch {tested_torch_text()}); "
            "please report problems with `python -m flagos_torchfl env`",
        )


def check_plugin(module: str, version: str | None, tested: tuple[str, ...]) -> None:
    """Warn once when a vendor plugin's version is outside the versions tested with this package."""
    if version is None:
        return
    v = parse_version(version)[:2]
    if any(parse_version(t)[:2] == v for t in tested):
        return
    tested_text = ", ".join(tested) if tested else "none yet"
    warn_once(module, f"{module} {version} is untested with flagos_torchfl (tested: {tested_text})")


def require_torch(feature: str, minimum: tuple[int, int], version: str) -> None:
    """Raise a clear error when ``feature`` needs a newer torch than the one installed."""
    if parse_version(version)[:2] < minimum:
        raise RuntimeError(
            f"{feature} needs torch>={minimum[0]}.{minimum[1]}; this is torch {version}"
        )


def warn_once(key: str, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)
