"""CUDA entry points beyond devices and factories on the plain sim (cases:
:mod:`tests.redirect.chip_entry_points`)."""
from __future__ import annotations

import pytest

from tests.redirect.chip_entry_points import *  # noqa: F401,F403 - the cases and their fixture

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
PROFILE = None
