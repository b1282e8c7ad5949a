"""``FL_FALLBACK_BUDGET``: how many host fallbacks a run may take before it fails.

Forms: ``N`` (at most N fallback calls in the run), ``P%`` (fallback calls take at most P% of
operator time), either followed by ``:strict``, and ``strict`` alone (no fallback at all). Without
``:strict`` the run fails at exit; with it, at the first violation: the fallback call that
exceeds a count, or the optimizer step (or exit) at which the share is exceeded. A host fallback is
a call that ran on the host: the fallback route, or a decomposition that could not serve a call.
"""
from __future__ import annotations

import dataclasses
import re
from typing import List, Optional

from ..errors import ConfigError, FlagOSError

#: exit status of a run that exceeded its budget
EXIT_STATUS = 3

_FORMS = "a count (`10`), a share of operator time (`5%`), either with `:strict`, or `strict`"


class FallbackBudgetExceeded(FlagOSError, RuntimeError):
    """Host fallbacks exceeded ``FL_FALLBACK_BUDGET``; the message names the operators."""


@dataclasses.dataclass(frozen=True)
class Budget:
    """``calls``: most fallback calls allowed, or ``share``: most share of operator time (0..1)."""

    text: str
    calls: Optional[int] = None
    share: Optional[float] = None
    strict: bool = False


def parse(text: str) -> Budget:
    """The budget ``FL_FALLBACK_BUDGET=text`` describes; ConfigError naming the forms."""
    value = text.strip().lower().replace(" ", "")
    if value == "strict":
        return Budget(text, calls=0, strict=True)
    body, _, mode = value.partition(":")
    if mode not in ("", "strict"):
        raise ConfigError(f"FL_FALLBACK_BUDGET={text!r} is not valid: give {_FORMS}")
    if re.fullmatch(r"\d+", body):
        return Budget(text, calls=int(body), strict=bool(mode))
    found = re.fullmatch(r"(\d+(?:\.\d+)?)%", body)
    if found and float(found.group(1)) <= 100:
        return Budget(text, share=float(found.group(1)) / 100, strict=bool(mode))
    raise ConfigError(f"FL_FALLBACK_BUDGET={text!r} is not valid: give {_FORMS}")


def violation(budget: Budget, verdict: dict) -> Optional[str]:
    """What exceeds ``budget`` in ``verdict`` (a :func:`~.verdict.verdict` dict), naming the
    operators that fell back, costliest first; None when the run is within it."""
    used = verdict["routes"]["fallback"]
    if budget.calls is not None:
        if used["calls"] <= budget.calls:
            return None
        amount = f"{used['calls']} host fallback calls, more than the {budget.calls} allowed"
    else:
        if used["share"] is None or used["share"] <= budget.share:
            return None
        amount = (f"host fallbacks took {used['share']:.1%} of {verdict['time_basis']}, more than "
                  f"the {budget.share * 100:.4g}% allowed")
    return (f"fallback budget exceeded (FL_FALLBACK_BUDGET={budget.text}): {amount}: "
            + ", ".join(_offenders(verdict)))


def _offenders(verdict: dict) -> List[str]:
    out = []
    for row in verdict["operators"]:
        fell = row["routes"].get("fallback")
        if fell:
            out.append(f"{row['op']} ({fell['calls']} calls, {format_share(fell['share'])})")
    return out


def format_share(share: Optional[float]) -> str:
    return "-" if share is None else f"{share:.1%}"


class Guard:
    """Holds a run to ``budget``: ``report()`` gives the verdict dict. Strict counts are checked
    after each routed call (:meth:`after_call`), strict shares after each optimizer step
    (:meth:`after_step`); :meth:`at_exit` checks every budget when the process ends."""

    def __init__(self, budget: Budget, report):
        self.budget = budget
        self.report = report
        self.failed = False

    def after_call(self, name: str, route: str) -> None:
        if route == "fallback" and self.budget.strict and self.budget.calls is not None:
            self._check_now()

    def after_step(self) -> None:
        if self.budget.strict and self.budget.share is not None:
            self._check_now()

    def _check_now(self) -> None:
        message = violation(self.budget, self.report())
        if message:
            self.failed = True
            raise FallbackBudgetExceeded(message)

    def at_exit(self) -> None:
        """Print why and end the process with :data:`EXIT_STATUS` when the run exceeded the
        budget (unless a strict check already stopped it)."""
        if self.failed:
            return
        message = violation(self.budget, self.report())
        if message:
            import os
            import sys

            sys.stdout.flush()
            print(f"flagos_torchfl: {message}", file=sys.stderr, flush=True)
            os._exit(EXIT_STATUS)
