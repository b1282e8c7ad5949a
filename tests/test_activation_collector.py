"""Activation and Python's cyclic garbage collector: the launcher's activation runs with the
automatic collector paused (``startup.collector_paused``), so that its objects do not bring
forward the full collection ``import torch`` leaves due; afterwards the collector is as the
program had it, and every object stays collectable (nothing frozen)."""
from __future__ import annotations

import gc
import json

import pytest

from flagos_torchfl.startup import collector_paused
from tests.helpers import run_python


@pytest.fixture
def collector_on():
    """The collector enabled for the test, and as it was afterwards."""
    was = gc.isenabled()
    gc.enable()
    try:
        yield
    finally:
        (gc.enable if was else gc.disable)()


def test_the_block_runs_with_the_collector_off_and_it_is_on_again_afterwards(collector_on):
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_is_on_again_when_the_block_raises(collector_on):
    with pytest.raises(KeyError):
        with collector_paused():
            raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_program_stays_off(collector_on):
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_nested_pause_leaves_the_collector_off_until_the_outer_one_ends(collector_on):
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()


class _Cycle:
    def __init__(self):
        self.me = self


def test_cyclic_garbage_made_in_the_block_is_collected_afterwards(collector_on):
    frozen = gc.get_freeze_count()
    with collector_paused():
        cycle = _Cycle()
        assert gc.is_tracked(cycle)
        del cycle
    assert gc.get_freeze_count() == frozen
    assert gc.collect() >= 1


ACTIVATE = r'''
import gc, json, sys
import torch
if sys.argv[1] == "off":
    gc.disable()
from flagos_torchfl import startup
import flagos_torchfl as ft
seen = []
gc.callbacks.append(lambda phase, info: seen.append(info["generation"]) if phase == "start" else None)
startup.activate()
during = list(seen)
enabled = gc.isenabled()
keep = [[] for _ in range(5000)]  # the program's own objects
print(json.dumps({"backend": ft.current_backend().backend, "during": during, "enabled": enabled,
                  "after": seen[len(during):], "frozen": gc.get_freeze_count()}))
'''


@pytest.mark.full
@pytest.mark.parametrize("backend", ["cpu", "sim"])
def test_launcher_activation_collects_nothing_and_leaves_the_collector_running(backend):
    """In a fresh interpreter: no collection while activating but, at its end, the one of the
    youngest generation that the pause put off; the collector on afterwards, and the program's
    own allocations collected as usual (young generations first)."""
    proc = run_python(["-c", ACTIVATE, "on"], env={"FL_BACKEND": backend})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["backend"] == backend
    assert found["during"] in ([], [0]) and found["enabled"] is True and found["frozen"] == 0
    assert found["after"] and found["after"][0] == 0


@pytest.mark.full
def test_launcher_activation_keeps_a_collector_the_program_turned_off_off():
    proc = run_python(["-c", ACTIVATE, "off"], env={"FL_BACKEND": "sim"})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["enabled"] is False and found["during"] == [] and found["after"] == []
