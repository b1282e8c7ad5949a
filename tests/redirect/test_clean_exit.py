"""Leaving cleanly after collectives on gloo (redirect/clean_exit.py): at exit the GIL is released
until gloo's worker threads have freed their works; nothing about the program's own ending changes.

How often plain torch and the launcher abort or hang at exit is measured by
benchmarks/exit_reliability.py (docs/benchmarks.md), not asserted here."""
from __future__ import annotations

import ctypes
import hashlib
import os
import threading

import pytest
import torch
import torch.distributed as dist

import flagos_torchfl as ft
from flagos_torchfl.redirect import clean_exit
from flagos_torchfl.sim.integration import collectives
from tests.helpers import ROOT, run_python

JOB = str(ROOT / "tests" / "redirect" / "exit_job.py")
SETTLED = "worker threads settled"
needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"),
                                reason="threads are listed through /proc")


def _launch(backend: str, ending: str):
    return run_python(["-m", "flagos_torchfl", "run", "--backend", backend, JOB, ending],
                      env={"FL_LOG_LEVEL": "DEBUG"}, timeout=300)


@needs_proc
@pytest.mark.parametrize("backend", ["cpu", pytest.param("sim", marks=pytest.mark.needs_sim)])
@pytest.mark.parametrize("ending", ["destroy", "none"])
def test_a_finished_job_exits_0_after_settling_gloo(backend, ending):
    proc = _launch(backend, ending)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "trained" in proc.stdout
    # before destroy_process_group (when called) and at exit; at exit only where the workers are
    # still there (torch 2.13's are; torch 2.1 frees the group with the program's objects first)
    expected = (1, 2) if ending == "destroy" else (1,)
    assert proc.stderr.count(SETTLED) in expected, proc.stderr[-3000:]


@needs_proc
@pytest.mark.parametrize("ending, code, says", [
    ("raise", 1, "RuntimeError: the program failed after training"), ("exit3", 3, None)])
def test_a_failed_job_keeps_its_failure(ending, code, says):
    proc = _launch("cpu", ending)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert SETTLED in proc.stderr
    if says:
        assert says in proc.stderr


def _name_thread(name: bytes) -> None:
    ctypes.CDLL(None).prctl(15, name, 0, 0, 0)  # PR_SET_NAME: what /proc/self/task/N/comm shows


class _Worker(threading.Thread):
    """A thread the settle takes for a gloo worker: busy (hashing, the GIL mostly free) until
    ``stop`` is set, then idle until ``leave`` is set."""

    def __init__(self):
        super().__init__(daemon=True)
        self.named, self.stop, self.idle, self.leave = (threading.Event() for _ in range(4))

    def run(self):
        _name_thread(clean_exit.WORKER_NAME.encode())
        self.named.set()
        block = b"x" * (1 << 20)
        while not self.stop.is_set():
            hashlib.sha256(block).digest()
        self.idle.set()
        self.leave.wait()


@needs_proc
def test_settle_waits_for_a_busy_worker_and_gives_up_at_its_limit():
    worker = _Worker()
    worker.start()
    worker.named.wait(10)
    try:
        assert clean_exit.settle(limit_s=0.3) is False  # busy throughout
        threading.Timer(0.3, worker.stop.set).start()
        assert clean_exit.settle(limit_s=30) is True
        assert worker.idle.is_set()  # not settled while it was still busy
    finally:
        worker.stop.set()
        worker.leave.set()
        worker.join(10)


@needs_proc
@pytest.mark.parametrize("activated", [False, True])
def test_settle_finds_the_threads_of_a_real_gloo_group(monkeypatch, activated):
    """By torch's name for them; under activation also where this torch's gloo leaves them
    unnamed (torch 2.1), recorded as the group is built."""
    monkeypatch.delenv("FL_BACKEND", raising=False)
    ft.deactivate()
    if activated:
        ft.init_backend("cpu")
    elif not _gloo_names_its_workers():
        pytest.skip(f"torch {torch.__version__}'s gloo leaves its worker threads unnamed: "
                    "they are found under activation only")
    try:
        before = clean_exit._gloo_workers()
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            t = torch.ones(4)
            dist.all_reduce(t)
            assert len(clean_exit._gloo_workers()) > len(before)
            assert clean_exit.settle(limit_s=30) is True
        finally:
            dist.destroy_process_group()
    finally:
        ft.deactivate()


def _gloo_names_its_workers() -> bool:
    """Whether a gloo group of this torch names its worker threads (torch 2.1's does not).
    Asked under activation, whose ``destroy_process_group`` lets gloo's workers settle first:
    plain torch 2.1 freeing a gloo group can deadlock (a CI run hung here)."""
    ft.init_backend("cpu")
    try:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        try:
            dist.all_reduce(torch.ones(1))  # a worker names itself as it starts its loop
            return any(open(f"/proc/self/task/{tid}/comm").read().strip() == clean_exit.WORKER_NAME
                       for tid in os.listdir("/proc/self/task"))
        finally:
            dist.destroy_process_group()
    finally:
        ft.deactivate()


def test_destroy_process_group_is_wrapped_while_active_and_restored_after(monkeypatch):
    monkeypatch.delenv("FL_BACKEND", raising=False)
    original = dist.destroy_process_group
    ft.deactivate()
    ft.init_backend("cpu")
    try:
        assert dist.destroy_process_group is not original
        assert clean_exit._state == {"active": True}
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        dist.destroy_process_group()
        assert not dist.is_initialized()
    finally:
        ft.deactivate()
    assert dist.destroy_process_group is original
    assert clean_exit._state == {}


def test_sim_collective_helpers_are_joined_with_a_limit():
    release = threading.Event()
    collectives._start_helper(release.wait)
    assert collectives.join_helpers(limit_s=0.2) is False
    release.set()
    assert collectives.join_helpers(limit_s=30) is True
    assert not collectives._helpers
