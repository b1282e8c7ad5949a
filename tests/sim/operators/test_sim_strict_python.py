"""The sim's Python kernels (``FL_SIM_RUNTIME=python``) are as strict as a device: the cases of
:mod:`tests.sim.operators.strict_cases`."""
from __future__ import annotations

import pytest

from tests.sim.operators.strict_cases import *  # noqa: F401,F403 - the shared cases
from tests.sim.operators.strict_cases import activated_sim

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def sim():
    yield from activated_sim("python")
