"""What reaches the CUDA dispatch key, on the cpu backend (cases:
:mod:`tests.redirect.cuda_key_cases`)."""
from __future__ import annotations

import pytest

from tests.redirect.cuda_key_cases import *  # noqa: F401,F403 - the cases and their fixtures


pytestmark = pytest.mark.skipif(
    not __import__("flagos_torchfl").compat.has("library_get_kernel"),
    reason="torch 2.1 lacks what these entry points are (torch.library.get_kernel, torch.get_autocast_dtype, torch.nn.attention, ProfilerActivity.PrivateUse1, Storage.to) or what the tests read")

BACKEND = "cpu"
