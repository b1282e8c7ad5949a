"""The sim initialises lazily, as an accelerator does, and a child forked after first use cannot
touch the devices: ``is_initialized()`` is False until first use (queries and seeding do not
count), a child forked before first use works, a child forked after fails with CUDA's message
(the chip's own under a profile: tests/profiles/test_profile_ascend.py) when it touches a device,
and children that never touch one (DataLoader fork workers) work. The tests run in file order:
the first one runs before anything uses the devices."""
from __future__ import annotations

import multiprocessing
import os

import pytest
import torch

import flagos_torchfl as ft

pytestmark = pytest.mark.isolated

FORK = multiprocessing.get_context("fork")
MESSAGE = ("Cannot re-initialize SIM in forked subprocess. To use SIM with multiprocessing, you "
           "must use the 'spawn' start method")


@pytest.fixture(scope="module")
def sim():
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ["FL_SIM_DEVICES"] = "2"
    selection = ft.init_backend("sim")
    yield selection
    ft.deactivate()


def in_forked_child(work):
    """``work()``'s result in a child forked now, or ``"raised: <message>"``."""
    receive, send = FORK.Pipe(duplex=False)

    def child():
        try:
            send.send(work())
        except Exception as e:  # the child reports what it raised
            send.send(f"raised: {e}")

    process = FORK.Process(target=child)
    process.start()
    answer = receive.recv() if receive.poll(120) else "no answer"
    process.join(60)
    assert process.exitcode == 0, process.exitcode
    return answer


def use_a_device():
    return torch.ones(3, device="cuda").add(1).sum().item()


# (lambdas: torch.cuda's functions are the backend's once activated)
USES = (lambda: torch.cuda.init(), lambda: torch.cuda.synchronize(), lambda: torch.cuda.set_device(1),
        lambda: torch.cuda.get_rng_state(0), lambda: torch.cuda.Stream(),
        lambda: torch.cuda.Event().record(), lambda: torch.empty(0, device="cuda"))
QUERIES = (lambda: torch.cuda.device_count(), lambda: torch.cuda.get_device_name(),
           lambda: torch.cuda.get_device_properties(0), lambda: torch.cuda.memory_allocated(),
           lambda: torch.cuda.mem_get_info(), lambda: torch.cuda.manual_seed(1),
           lambda: torch.cuda.is_bf16_supported(), lambda: torch.cuda.current_device())


def test_nothing_initialises_the_devices_before_first_use_and_a_fork_then_works(sim):
    assert not torch.sim.is_initialized() and not torch.cuda.is_initialized()
    assert torch.cuda.device_count() == 2 and torch.cuda.get_device_name(1)
    assert torch.cuda.get_device_properties(0).total_memory > 0 and torch.cuda.memory_allocated() == 0
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    assert not torch.sim.is_initialized() and not torch.sim._initialized
    assert in_forked_child(use_a_device) == 6.0  # forked before first use
    # each in a child forked before first use: what counts as a use, and what does not
    for use in USES:
        assert in_forked_child(lambda: (use(), torch.sim.is_initialized())[1]) is True, use
    for query in QUERIES:
        assert in_forked_child(lambda: (query(), torch.sim.is_initialized())[1]) is False, query
    assert not torch.sim.is_initialized()
    x = torch.ones(2, device="cuda")
    assert torch.sim.is_initialized() and torch.cuda.is_initialized() and torch.sim._initialized
    assert x.device == torch.device("sim", 0) and not torch.sim._is_in_bad_fork()


def test_a_child_forked_after_use_fails_when_it_touches_a_device(sim):
    kept = torch.ones(2, device="cuda")
    assert in_forked_child(use_a_device) == f"raised: {MESSAGE}"
    assert in_forked_child(lambda: kept.add_(1).sum().item()) == f"raised: {MESSAGE}"  # in place
    assert in_forked_child(lambda: kept.cpu().tolist()) == f"raised: {MESSAGE}"
    states = in_forked_child(lambda: (torch.sim.is_initialized(), torch.sim._is_in_bad_fork(),
                                      torch.cuda.is_initialized()))
    assert states == (False, True, False)
    assert kept.tolist() == [1.0, 1.0] and use_a_device() == 6.0  # the parent goes on


def test_a_child_that_never_touches_a_device_works(sim):
    torch.ones(1, device="cuda")
    assert in_forked_child(lambda: (torch.arange(4) * 2).tolist()) == [0, 2, 4, 6]
    assert in_forked_child(lambda: torch.cuda.device_count()) == 2  # queries are no use of the device
    data = torch.arange(16, dtype=torch.float32).reshape(8, 2)
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=2,
                                         multiprocessing_context="fork")
    total = sum(batch.to("cuda").sum() for batch in loader)
    assert total.item() == data.sum().item() and total.device.type == "sim"


def test_every_use_fails_in_a_child_forked_after_use(sim):
    torch.ones(1, device="cuda")
    for use in USES:
        assert in_forked_child(use) == f"raised: {MESSAGE}", use
    assert torch.cuda.current_device() == 0
