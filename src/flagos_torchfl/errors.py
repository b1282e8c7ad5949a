"""Exceptions raised by flagos_torchfl. Every error names the problem and, where there is a
choice, the valid choices."""
from __future__ import annotations

import difflib
from typing import Iterable


def closest(name: str, choices: Iterable[str], n: int = 3) -> list[str]:
    """The choices most similar to ``name``, best first (possibly empty)."""
    return difflib.get_close_matches(str(name), list(choices), n=n, cutoff=0.5)


def suggestion(name: str, choices: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` or an empty string."""
    found = closest(name, choices, n=1)
    return f" Did you mean {found[0]!r}?" if found else ""


class FlagOSError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(FlagOSError, ValueError):
    """A setting (argument, environment variable or assignment) has an invalid value."""


class UnknownBackendError(ConfigError):
    """A backend name that no registered backend or alias answers to."""

    def __init__(self, name: str, valid: Iterable[str], source: str = "backend"):
        valid = sorted(valid)
        self.name, self.valid = name, valid
        super().__init__(
            f"unknown {source} {name!r}.{suggestion(name, valid)} Valid names: {', '.join(valid)}"
        )


class BackendUnavailableError(FlagOSError, RuntimeError):
    """A backend was asked for explicitly but its probe found it unusable."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason
        super().__init__(f"backend {name!r} is not available: {reason}")


class AlreadyInitializedError(FlagOSError, RuntimeError):
    """init_backend was called again with settings different from the active ones."""


class ActivationError(FlagOSError, RuntimeError):
    """The redirection layer cannot be activated (e.g. another migration shim already patched torch)."""


class UnsupportedFeatureError(FlagOSError, AttributeError):
    """A torch.cuda feature the active backend cannot serve."""


class OperatorNotSupportedError(FlagOSError, NotImplementedError):
    """No route (native, library, composite, CPU fallback) can run an operator on the backend."""

    def __init__(self, op: str, backend: str, tried: list[tuple[str, str]] | None = None):
        self.op, self.backend, self.tried = op, backend, list(tried or [])
        lines = "".join(f"\n  - {route}: {why}" for route, why in self.tried)
        super().__init__(f"operator {op} cannot run on backend {backend!r}; routes tried:{lines or ' none'}")


class DeviceOrdinalError(FlagOSError, RuntimeError):
    """User code named ``cuda:N`` for an N the active backend does not have."""


class PrivateUse1ClaimedError(FlagOSError, RuntimeError):
    """PyTorch's single PrivateUse1 slot is already taken by another backend."""


class CheckpointError(FlagOSError, RuntimeError):
    """A file given as a checkpoint is not a sound one (empty, cut short, not torch's format), or
    torch wrote an archive ``ft.save`` cannot add its record to."""
