"""What reaches the CUDA dispatch key, on the cpu backend (cases:
:mod:`tests.redirect.cuda_key_cases`)."""
from __future__ import annotations

from tests.redirect.cuda_key_cases import *  # noqa: F401,F403 - the cases and their fixtures

BACKEND = "cpu"
