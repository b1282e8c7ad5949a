"""The verdict's last line says what the process ran: a process that ran nothing on the device (a
torchrun agent under ``run --report``) is not told that every operator ran natively."""
from __future__ import annotations

from flagos_torchfl.routing import verdict


def _data(native_calls):
    routes = {route: {"operators": 0, "calls": 0, "ms": 0.0, "share": None, "host_bytes": 0}
              for route in verdict.ROUTES}
    routes["native"].update(calls=native_calls, operators=None if native_calls is None else 3)
    return {"backend": "sim", "profile": None, "table": None, "device_type": "sim", "steps": 0,
            "time_basis": "operator time", "routes": routes, "operators": [], "cuda_api_missing": None}


def test_a_process_that_ran_nothing_says_so():
    assert verdict.render(_data(0)).splitlines()[-1] == "no operator ran on sim in this process"


def test_native_calls_counted_or_not_counted():
    assert verdict.render(_data(12)).splitlines()[-1] == "every operator ran natively on sim"
    # a real chip's native calls are not counted: nothing says it ran none
    assert verdict.render(_data(None)).splitlines()[-1] == "every operator ran natively on sim"
