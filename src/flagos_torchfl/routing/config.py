"""What routing takes from the environment, read and validated once when a selection is made:
per-operator overrides (``FL_ROUTING_CONFIG`` overlaid by ``FL_OP_ROUTE``), how routes are
registered with the dispatcher (``FL_ROUTING_REGISTRATION``) and the fallback budget
(``FL_FALLBACK_BUDGET``)."""
from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional, Tuple

from .. import variables
from . import budget as _budget
from . import overrides as _overrides

@dataclasses.dataclass(frozen=True)
class RoutingConfig:
    """Routing inputs. ``overrides``: (overload, (route, entry as written, source)) pairs."""

    overrides: Tuple[Tuple[str, Tuple[str, str, str]], ...] = ()
    registration: str = "auto"
    budget: Optional[_budget.Budget] = None

    def override_table(self) -> _overrides.Overrides:
        return dict(self.overrides)


def routing_config(environ: Mapping[str, str] = os.environ) -> RoutingConfig:
    """The routing inputs the environment gives; ConfigError names a bad file, name or route."""
    table = _overrides.from_env(environ)
    budget = variables.read("FL_FALLBACK_BUDGET", environ)
    return RoutingConfig(tuple(sorted(table.items())), variables.read("FL_ROUTING_REGISTRATION", environ),
                         None if budget is None else _budget.parse(budget))
