"""``CUDA_VISIBLE_DEVICES`` applied as a vendor's own device mask (``ASCEND_RT_VISIBLE_DEVICES``...).

Rules:

- only for the backend being probed or activated, and only once its plugin is known to exist;
- a vendor variable the user set wins; one this package set (recorded in the internal variable
  ``FL_VISIBLE_DEVICES_TRANSLATED`` as ``NAME=VALUE`` pairs, which children inherit) is
  re-translated from the process's own ``CUDA_VISIBLE_DEVICES``, so a child's per-worker mask
  wins over the value its parent translated;
- every translation returns an undo that restores the variable and the record exactly.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Dict, Iterator, MutableMapping, Optional

from .. import variables
from ..log import get_logger

log = get_logger("backends")
MARK = "FL_VISIBLE_DEVICES_TRANSLATED"


def _marks(environ: MutableMapping[str, str]) -> Dict[str, str]:
    pairs = (item.partition("=") for item in environ.get(MARK, "").split(";") if "=" in item)
    return {name: value for name, _, value in pairs}


def translate(variable: Optional[str], environ: MutableMapping[str, str] = os.environ
              ) -> Optional[Callable[[], None]]:
    """Set ``variable`` to ``CUDA_VISIBLE_DEVICES`` unless the user set it; returns the undo,
    or None when nothing changed."""
    cuda_mask = environ.get("CUDA_VISIBLE_DEVICES")
    if not variable or cuda_mask is None:
        return None
    marks = _marks(environ)
    current = environ.get(variable)
    if current is not None and marks.get(variable) != current:
        return None  # the user's own mask
    if current == cuda_mask and marks.get(variable) == cuda_mask:
        return None
    undo = variables.restorer(environ, (variable, MARK))
    environ[variable] = cuda_mask
    marks[variable] = cuda_mask
    environ[MARK] = ";".join(f"{k}={v}" for k, v in sorted(marks.items()))
    log.info("CUDA_VISIBLE_DEVICES=%s applied as %s", cuda_mask, variable)

    return undo


@contextlib.contextmanager
def translated(variable: Optional[str], environ: MutableMapping[str, str] = os.environ) -> Iterator[None]:
    """``variable`` translated for the duration of the block (a probe), then restored."""
    undo = translate(variable, environ)
    try:
        yield
    finally:
        if undo is not None:
            undo()
