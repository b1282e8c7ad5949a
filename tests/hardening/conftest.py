"""Every hardening test starts and ends with nothing active, no assigned setting and no
``FL_*`` or device-mask variable from the caller's environment."""
import os

import pytest

import flagos_torchfl as ft
from tests.helpers import CLEAN_PREFIXES


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in list(os.environ):
        if name.startswith(CLEAN_PREFIXES) or "VISIBLE_DEVICES" in name:
            monkeypatch.delenv(name)
    ft.deactivate()
    yield
    ft.deactivate()
    from flagos_torchfl import api

    api._assigned.clear()
