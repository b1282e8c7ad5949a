"""The Ascend profile installed in this process: the simulated device is ``npu``, CUDA code and
code written for the NPU both run on it, float64 work is routed and reported, and the fallback
budget stops a strict run at the first violation."""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.isolated

MEMORY = 256 << 20


@pytest.fixture(scope="module")
def ascend():
    for name in list(os.environ):
        if name.startswith("FL_") or name in ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE"):
            del os.environ[name]
    for name in [n for n in os.environ if n.startswith(("HCCL_", "TORCH_HCCL_", "NCCL_", "TORCH_NCCL_"))]:
        del os.environ[name]
    os.environ.update(FL_SIM_PROFILE="ascend", ASCEND_RT_VISIBLE_DEVICES="0,1", FL_SIM_DEVICE_MEMORY="256MiB",
                      NCCL_SOCKET_IFNAME="lo", CUDA_LAUNCH_BLOCKING="1", TORCH_NCCL_BLOCKING_WAIT="1")
    import flagos_torchfl as ft

    selection = ft.init_backend("sim")
    yield selection
    ft.deactivate()


def test_the_device_is_named_npu_and_answers_with_the_chips_traits(ascend):
    import flagos_torchfl.sim.runtime.device as sim_module

    assert ascend.chip.name == "sim-ascend" and ascend.device_type == "npu"
    assert torch._C._get_privateuse1_backend_name() == "npu" and torch.npu is sim_module
    assert torch.cuda.device_count() == 2 == torch.npu.device_count()  # ASCEND_RT_VISIBLE_DEVICES=0,1
    assert torch.cuda.get_device_properties(0).total_memory == MEMORY
    assert torch.cuda.get_device_name(0) == "Ascend910B1 (flagos sim)" == torch.npu.get_device_name(1)
    assert ascend.collective == "hccl"


def test_the_questions_cuda_code_asks_get_the_910b_s_answers(ascend):
    import torch.distributed as dist

    assert dist.is_nccl_available() and dist.is_backend_available("nccl")  # "nccl" is served by hccl
    assert torch.cuda.is_bf16_supported() and torch.cuda.get_device_capability() == (8, 0)
    props = torch.cuda.get_device_properties(1)
    assert (props.major, props.minor) == (8, 0) and props.total_memory == MEMORY
    assert torch.cuda.is_tf32_supported() is False  # Ascend's is HF32
    assert torch.cuda.get_arch_list() == [] and torch.cuda.get_gencode_flags() == ""
    assert torch.cuda.nccl.version() == (0, 0, 0)
    assert torch.cuda.nccl.is_available([torch.ones(1, device="cuda")])
    assert not torch.cuda.nccl.is_available([torch.ones(1)])


def test_nvidia_s_variables_reach_the_chip_s_own(ascend):
    assert os.environ["HCCL_SOCKET_IFNAME"] == "lo" and os.environ["ASCEND_LAUNCH_BLOCKING"] == "1"
    assert os.environ["TORCH_HCCL_BLOCKING_WAIT"] == "1"


def test_cuda_code_and_npu_code_run_on_the_simulated_npu(ascend):
    x = torch.randn(4, 3, device="cuda")
    y = torch.randn(4, 3).npu()
    z = torch.ones(3, device="npu:1")
    torch.npu.set_device(1)
    w = torch.zeros(2, device="npu")
    torch.npu.synchronize()
    assert x.device == y.device == torch.device("npu", 0)
    assert z.device == w.device == torch.device("npu", 1)
    torch.npu.set_device(0)
    with torch.autocast("cuda"):
        assert torch.get_autocast_dtype("npu") == torch.float16  # the chip's low-precision dtype


def test_memory_per_device_is_enforced(ascend):
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(MEMORY + (1 << 20), dtype=torch.uint8, device="npu")


def test_float64_work_is_routed_and_reported_while_float32_stays_native(ascend):
    from flagos_torchfl import routing

    a = torch.randn(6, 6, dtype=torch.float64)
    b = torch.randn(6, 6, dtype=torch.float32)
    on_npu = a.npu() @ a.npu()
    assert on_npu.device.type == "npu" and on_npu.dtype == torch.float64
    assert torch.equal(on_npu.cpu(), a @ a)
    assert torch.equal((b.npu() @ b.npu()).cpu(), b @ b)
    data = routing.current_verdict()
    mm = [o for o in data["operators"] if o["op"] == "aten::mm"]
    assert mm and mm[0]["route"] == "fallback" and mm[0]["dtypes"] == ["float64"]
    assert mm[0]["native_for_other_dtypes"] and mm[0]["host_bytes"] > 0
    assert data["routes"]["native"]["calls"] > 0 and data["time_basis"] == "operator time"
    assert data["profile"] == "ascend" and data["table"]["version"] == "2.14.0"
    from flagos_torchfl.routing import report
    from flagos_torchfl.routing.verdict import render

    text = render(data)
    assert "verdict for ascend (sim-ascend, device npu; operator table of torch-npu 2.14.0)" in text
    assert "aten::mm" in text and "native except for float64" in text
    assert text.splitlines()[-1].strip().startswith("aten::") and "verdict for ascend" in report.render()


def test_a_strict_budget_stops_the_run_at_the_first_fallback_beyond_it(ascend):
    import flagos_torchfl as ft
    from flagos_torchfl.routing.budget import FallbackBudgetExceeded

    ft.deactivate()
    os.environ["FL_FALLBACK_BUDGET"] = "1:strict"
    try:
        ft.init_backend("sim")
        a = torch.randn(4, 4, dtype=torch.float64).npu()  # a copy: no fallback
        a.exp()  # the one fallback call allowed
        with pytest.raises(FallbackBudgetExceeded, match=r"2 host fallback calls, more than the 1 allowed: "
                                                          r"aten::exp \(2 calls"):
            a.exp()
        a.float().exp()  # native calls are not counted
    finally:
        ft.deactivate()
        del os.environ["FL_FALLBACK_BUDGET"]
        ft.init_backend("sim")


def test_a_child_forked_after_use_gets_torch_npu_s_message(ascend):
    import multiprocessing

    torch.ones(1, device="npu")
    receive, send = multiprocessing.get_context("fork").Pipe(duplex=False)

    def child():
        try:
            torch.ones(1, device="cuda")
            send.send("no error")
        except RuntimeError as e:
            send.send(str(e))

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    assert receive.recv() == ("Cannot re-initialize NPU in forked subprocess. To use NPU with "
                              "multiprocessing, you must use the 'spawn' start method")
    process.join(60)


def test_dynamo_reading_torch_cuda_s_functions_is_no_use_by_the_program(ascend):
    """Dynamo's table of torch functions loads every ``torch.cuda`` function by name (through
    ``compile_traces_torch_functions``): the names the chip lacks must not count as the
    program's uses in the verdict."""
    import torch._dynamo.trace_rules as rules

    from flagos_torchfl.tables.device_modules import missing_uses

    rules.get_torch_obj_rule_map.cache_clear()  # (built already if dynamo loaded before activation)
    rules.get_torch_obj_rule_map()
    used = dict(missing_uses.rows("ascend"))
    assert not {"temperature", "power_draw", "clock_rate"} & set(used), used
