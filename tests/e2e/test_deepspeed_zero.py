"""DeepSpeed ZeRO-2 and ZeRO-3 from a CUDA-written script (``deepspeed.init_distributed()``,
``torch.cuda.set_device(LOCAL_RANK)``, bf16, ``.cuda()`` inputs), 2 processes through
``python -m flagos_torchfl run -- torchrun ...`` on the cpu backend and on sim: on sim the
engine, its parameters (ZeRO-3: their partitions) and the inputs are on the simulated devices,
DeepSpeed's accelerator and collective are the backend's, and the losses equal the cpu run's
within bf16 tolerance."""
from __future__ import annotations

import sys

import pytest

from tests.e2e.realclients import by_rank, client, records, requires, run_launched
from tests.helpers import free_port

pytestmark = requires("deepspeed")


_RUNS: dict = {}


def _zero(backend: str, stage: int, profile: str = "") -> dict:
    """Each rank's record of the client under the launcher (run once per arguments)."""
    key = (backend, stage, profile)
    if key not in _RUNS:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                    f"--master_port={free_port()}", client("deepspeed_zero.py"), str(stage)]
        env = {"FL_BACKEND": backend, "OMP_NUM_THREADS": "1", **({"FL_SIM_PROFILE": profile} if profile else {})}
        _RUNS[key] = by_rank(records(run_launched(["--", *torchrun], env=env, timeout=500), "deepspeed"))
    return _RUNS[key]


@pytest.fixture(scope="module", params=[2, 3], ids=["zero2", "zero3"])
def runs(request):
    stage = request.param
    return stage, _zero("cpu", stage), _zero("sim", stage)


def test_zero_trains_on_the_cpu_backend(runs):
    stage, cpu, _ = runs
    assert sorted(cpu) == [0, 1]
    for rank, got in cpu.items():
        assert (got["stage"], got["world"], got["accelerator"], got["backend"]) == (stage, 2, "cpu", "gloo")
        assert got["engine_device"] == "cpu" and got["param_devices"] == ["cpu"]
        assert got["input_devices"] == ["cpu"]
        assert got["losses"][-1] < got["losses"][0]  # it trains


def test_zero_trains_on_sim_like_the_cpu_backend(runs):
    stage, cpu, sim = runs
    assert sorted(sim) == [0, 1]
    for rank, got in sim.items():
        device = f"sim:{rank}"
        assert (got["stage"], got["world"], got["accelerator"], got["backend"]) == (stage, 2, "sim", "simccl")
        assert got["engine_device"] == device and got["param_devices"] == [device]
        assert got["input_devices"] == [device]
        assert got["partition_devices"] == ([device] if stage == 3 else [])
        assert got["losses"] == pytest.approx(cpu[rank]["losses"], rel=2e-2)
        assert got["losses"][-1] < got["losses"][0]


def test_zero2_on_the_ascend_profile_uses_its_device_and_collective():
    cpu, npu = _zero("cpu", 2), _zero("sim", 2, profile="ascend")
    assert sorted(npu) == [0, 1]
    for rank, got in npu.items():
        device = f"npu:{rank}"
        assert (got["accelerator"], got["backend"]) == ("npu", "hccl")
        assert got["engine_device"] == device and got["param_devices"] == [device]
        assert got["input_devices"] == [device]
        assert got["losses"] == pytest.approx(cpu[rank]["losses"], rel=2e-2)
