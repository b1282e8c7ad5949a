"""The same promises on the Python kernels (``FL_SIM_RUNTIME=python``, the route where no C++
compiler is present), with the CUDA-like native set ``device_kernel_ops``: :mod:`tests.sim.operators.route_cases`."""
from __future__ import annotations

import pytest

import flagos_torchfl.sim as fsim
from flagos_torchfl.sim.operators.native_ops import device_kernel_ops
from tests.sim.operators.route_cases import *  # noqa: F401,F403  (the shared cases run on this runtime)

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def sim():
    module = fsim.install(num_devices=2, native_ops=device_kernel_ops(), runtime="python")
    assert fsim.runtime_kind() == "python"
    return module
