"""The sim with its C++ runtime (two devices): what PyTorch's C++ side asks of an accelerator,
answered as an accelerator's runtime answers it. Each behaviour is what CUDA and the vendors'
plugins promise through torch's device-generic APIs (``torch.accelerator``, ``torch.Stream``,
``torch.Event``, the autograd engine, the profiler, pinned memory, storages, serialization)."""
from __future__ import annotations

import pickle
import threading
import time
import warnings

import pytest
import torch

import flagos_torchfl.sim as fsim

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def sim():
    module = fsim.install(num_devices=2, runtime="cpp")
    assert fsim.runtime_kind() == "cpp" and fsim.cpp_problem() is None
    return module


def test_device_capability_lists_the_dtypes_it_computes(sim):
    capability = torch.accelerator.get_device_capability("sim:1")
    dtypes = capability["supported_dtypes"]
    assert {torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64} <= dtypes
    assert torch.accelerator.get_device_capability(0) == capability
    with pytest.raises(RuntimeError, match="invalid sim device index 2"):
        torch.accelerator.get_device_capability(2)


def test_accelerator_device_index_switches_the_device_where_tensors_land(sim):
    assert torch.accelerator.current_device_index() == 0
    with torch.accelerator.device_index(1):
        assert torch.accelerator.current_device_index() == 1 and sim.current_device() == 1
        assert torch.empty(2, device="sim").device == torch.device("sim:1")
        assert torch.ones(2, device="sim").add(1).device == torch.device("sim:1")
    assert torch.accelerator.current_device_index() == 0 == sim.current_device()
    torch.accelerator.set_device_index(1)
    try:
        assert sim.current_device() == 1 and torch.zeros(1, device="sim").device.index == 1
    finally:
        torch.accelerator.set_device_index(0)


def test_current_device_is_per_thread(sim):
    seen = {}

    def worker():
        seen["start"] = torch.accelerator.current_device_index()
        sim.set_device(1)
        seen["set"] = sim.current_device()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"start": 0, "set": 1} and sim.current_device() == 0


def test_streams_belong_to_their_device_and_each_new_one_is_its_own(sim):
    a, b = torch.Stream(device="sim:1"), torch.Stream(device="sim:1")
    assert a.device == b.device == torch.device("sim:1")
    assert a.stream_id != b.stream_id and 0 not in (a.stream_id, b.stream_id)
    assert a != b and a.query() and b.query()
    a.synchronize()
    assert torch.accelerator.current_stream(1).stream_id == 0  # the default stream
    high = torch.Stream(device="sim:0", priority=-1)
    assert high.stream_id != torch.Stream(device="sim:0").stream_id


def test_current_stream_is_set_per_device_and_seen_by_torch_and_the_device_module(sim):
    s = torch.Stream(device="sim:1")
    torch.accelerator.set_stream(s)  # which makes the stream's device current, as documented
    try:
        assert torch.accelerator.current_stream(1) == s == sim.current_stream(1)
        assert sim.current_device() == 1 and torch.accelerator.current_stream() == s
        assert torch.accelerator.current_stream(0).stream_id == 0  # the other device's is its own
    finally:
        torch.accelerator.set_stream(sim.default_stream(1))
        torch.accelerator.set_device_index(0)
    with sim.stream(s):
        assert sim.current_device() == 1 and torch.accelerator.current_stream(1) == s
    assert sim.current_stream(1) == sim.default_stream(1) and sim.current_device() == 0
    mine = sim.Stream(1)
    assert isinstance(mine, torch.Stream) and isinstance(mine, sim.Stream)
    assert mine.device == torch.device("sim:1") and not isinstance(torch.Stream(device="cpu"), sim.Stream)


def test_events_record_the_host_time_on_their_stream(sim):
    start, end = torch.Event(enable_timing=True), torch.Event(enable_timing=True)
    stream = torch.Stream(device="sim:1")
    start.record(stream)
    time.sleep(0.05)
    end.record(stream)
    end.synchronize()
    assert start.event_id != 0 and end.event_id != 0 and end.query()
    assert start.device == torch.device("sim:1")
    assert 45 <= start.elapsed_time(end) < 5000
    stream.wait_event(end)
    torch.Stream(device="sim:0").wait_stream(stream)
    with pytest.raises(ValueError, match="enable_timing"):
        torch.Event().elapsed_time(end)
    event = sim.Event(enable_timing=True)
    event.record()
    assert isinstance(event, torch.Event) and event.device == torch.device("sim:0")
    assert event.elapsed_time(end) != 0  # another of torch's own events
    with pytest.raises(RuntimeError, match="cannot be shared between processes"):
        sim.Event(interprocess=True)


def test_the_autograd_engine_runs_one_worker_thread_per_device(sim):
    for index in (0, 1):
        x = torch.ones(3, device=f"sim:{index}", requires_grad=True)
        (x * 2).sum().backward()
        assert x.grad.device == torch.device("sim", index) and x.grad.cpu().tolist() == [2.0] * 3
    names = set()
    import os

    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/comm") as f:
            names.add(f.read().strip())
    assert {"pt_autograd_0", "pt_autograd_1"} <= names


def test_the_profiler_times_sim_work_without_complaint(sim, capfd):
    model = torch.nn.Linear(8, 8).to("sim:1")
    x = torch.randn(4, 8, device="sim:1")
    started = time.perf_counter()
    with torch.autograd.profiler.profile(use_device="sim") as prof:
        for _ in range(20):
            model(x).sum()
    elapsed = time.perf_counter() - started
    events = prof.function_events
    assert events and all(0 <= e.cpu_time_total < elapsed * 1e6 * 2 for e in events)
    assert any(e.name == "aten::addmm" for e in events)
    err = capfd.readouterr().err
    assert "PrivateUse1 used in profiler but not enabled" not in err and "INTERNAL ASSERT" not in err


def test_pinned_host_memory_is_known_to_the_hooks(sim):
    pinned = torch.arange(8.0).pin_memory()
    assert pinned.is_pinned() and not torch.arange(8.0).is_pinned()
    view = torch.empty(0).set_(pinned.untyped_storage(), 2, (3,))
    assert view.is_pinned() and view.tolist() == [2.0, 3.0, 4.0]
    allocated = torch.empty(16, pin_memory=True)
    assert allocated.is_pinned()
    moved = pinned.to("sim:1", non_blocking=True)
    assert moved.device == torch.device("sim:1") and moved.cpu().tolist() == pinned.tolist()
    loader = torch.utils.data.DataLoader(torch.arange(6.0), batch_size=3, pin_memory=True)
    assert all(batch.is_pinned() for batch in loader)


def test_storages_have_the_device_s_methods(sim):
    storage = torch.arange(4.0).untyped_storage()
    assert storage.is_sim is False
    on_device = storage.sim(1)
    assert on_device.is_sim and on_device.device == torch.device("sim:1")
    assert torch.tensor([], device="sim:1").set_(on_device).cpu().tolist() == [0, 1, 2, 3]


def test_a_legacy_typed_storage_is_restored_onto_the_device(sim):
    typed = torch.arange(4.0).storage()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        restored = torch.serialization.default_restore_location(typed, "sim:1")
    assert isinstance(restored, torch.TypedStorage) and restored.dtype == torch.float32
    assert restored.device == torch.device("sim:1") and restored.tolist() == [0.0, 1.0, 2.0, 3.0]
    untyped = torch.serialization.default_restore_location(torch.arange(2.0).untyped_storage(), "sim:0")
    assert isinstance(untyped, torch.UntypedStorage) and untyped.device == torch.device("sim:0")
    assert pickle.loads(pickle.dumps(torch.ones(2, device="sim:1"))).device == torch.device("sim:1")


def test_the_cpp_runtime_cannot_be_swapped_for_the_python_one(sim):
    from flagos_torchfl.errors import ConfigError

    with pytest.raises(ConfigError, match="C\\+\\+ runtime|cpp runtime"):
        fsim.install(num_devices=2, runtime="python")
    assert fsim.install(num_devices=2, runtime="auto") is sim
    with pytest.raises(ConfigError, match="Did you mean 'cpp'"):
        fsim.install(num_devices=2, runtime="cppp")


def test_the_former_name_native_still_selects_the_cpp_runtime_with_a_warning(sim):
    with pytest.warns(FutureWarning, match="say 'cpp'"):
        assert fsim.install(num_devices=2, runtime="native") is sim
