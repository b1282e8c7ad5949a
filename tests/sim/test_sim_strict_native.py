"""The sim's native runtime (``FL_SIM_RUNTIME=native``) are as strict as a device: the cases of
:mod:`tests.sim.strict_cases`."""
from __future__ import annotations

import os

import pytest
import torch

import flagos_torchfl as ft
from tests.sim.strict_cases import *  # noqa: F401,F403 - the shared cases

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def sim():
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ.update(FL_SIM_RUNTIME="native")
    ft.init_backend("sim")
    yield torch.sim
    ft.deactivate()
