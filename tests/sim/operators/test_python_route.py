"""The same promises on the Python kernels (``FL_SIM_RUNTIME=python``, the route where no C++
compiler is present), with the CUDA-like native set ``device_kernel_ops``:
:mod:`tests.sim.operators.route_cases`."""
from __future__ import annotations

import pytest

from tests.sim.operators.route_cases import *  # noqa: F401,F403  (the shared cases run on this runtime)
from tests.sim.operators.route_cases import installed_sim

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def sim():
    return installed_sim("python")
