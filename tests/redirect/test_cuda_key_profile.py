"""What reaches the CUDA dispatch key, on the sim under the Ascend profile, device type ``npu``
(cases: :mod:`tests.redirect.cuda_key_cases`)."""
from __future__ import annotations

import pytest

from tests.redirect.cuda_key_cases import *  # noqa: F401,F403 - the cases and their fixtures

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
BACKEND = "sim"
PROFILE = "ascend"
