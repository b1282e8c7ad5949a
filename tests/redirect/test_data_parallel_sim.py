"""``torch.nn.DataParallel`` and the device-comm primitives on the plain sim with two devices
(cases: :mod:`tests.redirect.data_parallel_cases`)."""
from __future__ import annotations

import pytest

from tests.redirect.data_parallel_cases import *  # noqa: F401,F403 - the cases and their fixture

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
PROFILE = None
DEVICES = 2
