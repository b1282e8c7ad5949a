"""The sim device installed with two devices: device module, torch.accelerator, RNG, streams."""
from __future__ import annotations

import pytest
import torch

import flagos_torchfl.sim as fsim
from flagos_torchfl.errors import ConfigError

pytestmark = pytest.mark.isolated


@pytest.fixture(scope="module")
def sim():
    return fsim.install(num_devices=2)


def test_install_registers_torch_sim_and_is_idempotent(sim):
    assert fsim.is_installed()
    assert sim is torch.sim is torch.get_device_module("sim")
    assert torch._C._get_privateuse1_backend_name() == "sim"
    assert fsim.install(num_devices=2) is sim
    assert fsim.native_op_names() == fsim.default_native_ops()


def test_install_with_other_arguments_is_refused(sim):
    with pytest.raises(ConfigError, match="2 device"):
        fsim.install(num_devices=3)
    with pytest.raises(ConfigError, match="native operator set"):
        fsim.install(num_devices=2, native_ops=["add"])
    with pytest.raises(ConfigError, match="set_memory_limit"):
        fsim.install(num_devices=2, memory_limit=1 << 20)
    with pytest.raises(ConfigError):
        fsim.install(num_devices=0)


def test_device_module_basics(sim):
    assert sim.is_available() and not sim._is_in_bad_fork()  # initialisation: test_sim_fork.py
    assert sim.device_count() == 2
    assert sim.get_device_name() == sim.get_device_name(1) == "flagos sim device"
    props = sim.get_device_properties("sim:1")
    assert props.name == "flagos sim device" and props.total_memory == 16 << 30 and props.index == 1
    # installed directly, without the rules activation registers: autocast would cast nothing
    assert not sim.is_bf16_supported() and sim.get_amp_supported_dtype() == []
    sim.synchronize()
    sim.synchronize("sim:1")
    with pytest.raises(RuntimeError, match="invalid sim device index 5"):
        sim.synchronize(5)
    with pytest.raises(ValueError):
        sim.synchronize("cpu")


def test_current_device_and_context(sim):
    assert sim.current_device() == 0
    with sim.device(1):
        assert sim.current_device() == 1
        assert torch.empty(2, device="sim").device == torch.device("sim:1")
        assert torch.accelerator.current_device_index() == 1
    assert sim.current_device() == 0
    sim.set_device("sim:1")
    try:
        assert torch.zeros(1, device="sim").device.index == 1
    finally:
        sim.set_device(0)
    torch.accelerator.set_device_index(1)
    assert sim.current_device() == 1
    torch.accelerator.set_device_index(0)


def test_torch_accelerator_is_truthful(sim):
    assert torch.accelerator.current_accelerator() == torch.device("sim")
    assert torch.accelerator.is_available()
    assert torch.accelerator.device_count() == 2
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)
    t = torch.ones(1000, device="sim:1")
    assert torch.accelerator.memory_allocated(1) == sim.memory_allocated(1) >= t.nbytes
    assert torch.accelerator.memory_reserved(1) == sim.memory_reserved(1)
    assert torch.accelerator.memory_stats(1) == sim.memory_stats(1)
    assert torch.accelerator.get_memory_info(1) == sim.mem_get_info(1)


def test_tensor_and_module_helpers(sim):
    t = torch.ones(2).sim(1)
    assert t.is_sim and t.device == torch.device("sim:1")
    m = torch.nn.Linear(2, 2).sim()
    assert m.weight.device == torch.device("sim:0")


def test_manual_seed_makes_random_ops_deterministic(sim):
    def draw():
        x = torch.empty(6, device="sim")
        return [torch.randn(4, device="sim").cpu(), torch.rand(4, device="sim").cpu(),
                x.normal_().cpu(), x.uniform_(-1, 1).cpu(),
                torch.randint(0, 100, (5,), device="sim").cpu(),
                torch.randperm(8, device="sim").cpu(),
                torch.bernoulli(torch.full((6,), 0.5, device="sim")).cpu(),
                torch.nn.functional.dropout(torch.ones(8, device="sim"), 0.5).cpu()]

    sim.manual_seed(1234)
    first = draw()
    sim.manual_seed(1234)
    torch.randn(100)  # the CPU generator is not the device's
    second = draw()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    sim.manual_seed(99)
    assert not torch.equal(draw()[0], first[0])
    assert sim.initial_seed() == 99


def test_torch_manual_seed_seeds_every_device(sim):
    torch.manual_seed(7)
    a0, a1 = torch.randn(3, device="sim:0").cpu(), torch.randn(3, device="sim:1").cpu()
    torch.manual_seed(7)
    assert torch.equal(a0, torch.randn(3, device="sim:0").cpu())
    assert torch.equal(a1, torch.randn(3, device="sim:1").cpu())
    assert torch.equal(a0, a1)  # same seed, same generator algorithm


def test_rng_state_roundtrip_and_fork_rng(sim):
    state = sim.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    a = torch.randn(5, device="sim").cpu()
    sim.set_rng_state(state)
    assert torch.equal(a, torch.randn(5, device="sim").cpu())
    states = sim.get_rng_state_all()
    assert len(states) == 2
    b = torch.randn(5, device="sim:1").cpu()
    sim.set_rng_state_all(states)
    assert torch.equal(b, torch.randn(5, device="sim:1").cpu())
    with torch.random.fork_rng(devices=[0], device_type="sim"):
        c = torch.randn(5, device="sim").cpu()
    assert torch.equal(c, torch.randn(5, device="sim").cpu())
    sim.seed()
    sim.seed_all()


def test_torch_generator_on_sim_is_a_generator_of_that_device(sim):
    gen = torch.Generator(device="sim:1")
    assert isinstance(gen, torch.Generator) and gen.device == torch.device("sim", 1)
    gen.manual_seed(4)
    drawn = torch.rand(3, device="sim:1", generator=gen)
    again = torch.rand(3, device="sim:1", generator=torch.Generator(device="sim:1").manual_seed(4))
    assert torch.equal(drawn.cpu(), again.cpu())
    assert gen.get_offset() == 4 and not torch.equal(drawn.cpu(), torch.rand(3, device="sim:1", generator=gen).cpu())
    assert torch.Generator().device == torch.device("cpu")


def test_streams_and_events(sim):
    s = sim.Stream()
    assert s.query() and s.device == torch.device("sim:0")
    assert sim.current_stream() == sim.default_stream()
    with sim.stream(s):
        assert sim.current_stream() == s
    assert sim.current_stream() == sim.default_stream()
    start, end = sim.Event(enable_timing=True), sim.Event(enable_timing=True)
    start.record()
    torch.ones(100, device="sim").sum()
    end.record()
    end.synchronize()
    assert end.query() and start.elapsed_time(end) >= 0.0
    # torch.Event raises ValueError where torch.cuda.Event raises RuntimeError; the sim's
    # events are torch.Events with its C++ runtime, its own (CUDA's errors) without
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        sim.Event().elapsed_time(end)
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        sim.Event(enable_timing=True).elapsed_time(end)
    s.wait_stream(sim.default_stream())
    s.record_event().wait()


def test_second_device_holds_its_own_tensors(sim):
    a = torch.arange(4.0).to("sim:1")
    assert a.device == torch.device("sim:1")
    b = (a * 2).to("sim:0")
    assert b.device == torch.device("sim:0") and b.cpu().tolist() == [0, 2, 4, 6]
    with pytest.raises(RuntimeError, match="same device"):
        a + b
    with pytest.raises(RuntimeError, match="same device"):
        a + torch.ones(4)  # a non-scalar CPU tensor, as on a real device
    assert (a + torch.tensor(1.0)).device == a.device  # a CPU 0-dim scalar is fine


def test_backward_on_second_device(sim):
    x = torch.ones(3, device="sim:1", requires_grad=True)
    (x * 3).sum().backward()
    assert x.grad.device == torch.device("sim:1") and x.grad.cpu().tolist() == [3, 3, 3]


def test_autocast_and_grad_scaler_construct(sim):
    with torch.autocast("sim", dtype=torch.bfloat16):
        y = torch.ones(2, 2, device="sim") @ torch.ones(2, 2, device="sim")
    assert y.cpu().tolist() == [[2, 2], [2, 2]]
    scaler = torch.amp.GradScaler("sim", init_scale=4.0)
    assert scaler.scale(torch.ones(1, device="sim")).cpu().item() == 4.0


def test_generator_state_is_seed_and_offset_as_on_an_accelerator(sim):
    from torch.distributed.tensor._random import _PhiloxState

    sim.manual_seed(11)
    state = _PhiloxState(sim.get_rng_state())
    assert state.state.numel() == 16 and state.seed.item() == 11 and state.offset.item() == 0
    first = torch.rand(5, device="sim").cpu()
    assert _PhiloxState(sim.get_rng_state()).offset.item() == 8  # 5 values, rounded up to 4
    state.offset = state.offset + 8  # what DTensor does to give a shard its own stream
    sim.set_rng_state(state.state)
    shifted = torch.rand(5, device="sim").cpu()
    state.offset = torch.tensor([8])
    sim.set_rng_state(state.state)
    assert torch.equal(shifted, torch.rand(5, device="sim").cpu()) and not torch.equal(first, shifted)
    with pytest.raises(RuntimeError, match="16 uint8 values"):
        sim.set_rng_state(torch.get_rng_state())
    state.offset = torch.tensor([6])
    with pytest.raises(RuntimeError, match="multiple of 4"):
        sim.set_rng_state(state.state)
