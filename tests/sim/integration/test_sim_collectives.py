"""The sim's collectives (flagos_torchfl.sim.integration.collectives) against plain gloo on CPU tensors.

Two ranks run ``scripts/collectives_rank.py`` three times at once: on sim devices with the group
``"cpu:gloo,sim:simccl"``, on sim devices with ``"simccl"`` alone, and on the CPU with plain
gloo (the reference). The sim runs the CPU's kernels and the staged collectives run gloo on
host copies, so every result must be bit-identical to the reference. The module also claims
PrivateUse1 in its own process (registration errors, exact byte counts on a one-rank group),
hence isolated.
"""
from __future__ import annotations

import concurrent.futures
import datetime
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import clean_env, free_port

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]

SCRIPT = Path(__file__).parent / "collectives_rank.py"
ALL = ("collectives", "async_handles", "faults", "ddp", "fsdp2", "dtensor", "dcp")
RUNS = {"sim": ALL, "cpu": ALL, "simonly": ("collectives", "dcp")}
WORLD = 2


def _launch(mode: str, scenarios, out: Path) -> list[str]:
    """Run both ranks of ``mode`` and return their outputs (stdout+stderr)."""
    out.mkdir(parents=True)
    env = clean_env({"WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port()), "CKPT_DIR": str(out / "ckpt")})
    procs = [subprocess.Popen([sys.executable, str(SCRIPT), mode, str(out), ",".join(scenarios)],
                              env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(WORLD)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=240)[0])
        except subprocess.TimeoutExpired:
            p.kill()
            logs.append(p.communicate()[0] + "\n<killed after 240 s>")
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ranks")
    with concurrent.futures.ThreadPoolExecutor(len(RUNS)) as pool:
        logs = dict(zip(RUNS, pool.map(lambda m: _launch(m, RUNS[m], root / m), RUNS)))
    return root, logs


def result(runs, mode: str, scenario: str, rank: int):
    root, logs = runs
    path = root / mode / f"{scenario}.rank{rank}.pt"
    if not path.exists():
        pytest.fail(f"{mode} rank {rank} wrote no {scenario} result; its output:\n{logs[mode][rank][-3000:]}")
    record = torch.load(path, weights_only=False)
    if not record["ok"]:
        pytest.fail(f"{mode} rank {rank} {scenario} failed:\n{record['error'][-3000:]}")
    return record


def assert_identical(a, b, path="result"):
    """Equal structure, equal non-tensor values, tensors with the same dtype, shape and bits."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert (a.dtype, a.shape) == (b.dtype, b.shape), path
        assert torch.equal(a, b), f"{path}: {a} != {b}"
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_identical(x, y, f"{path}[{i}]")
    elif isinstance(a, dict):
        assert set(a) == set(b), f"{path}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            assert_identical(a[k], b[k], f"{path}.{k}")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def without(d: dict, *keys):
    return {k: v for k, v in d.items() if k not in keys}


# -- two ranks ------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["sim", "simonly"])
def test_every_collective_matches_gloo_on_cpu(runs, mode):
    for rank in range(WORLD):
        sim, cpu = result(runs, mode, "collectives", rank), result(runs, "cpu", "collectives", rank)
        assert sim["result"]["devices"] == ["sim"] and cpu["result"]["devices"] == ["cpu"]
        assert_identical(without(sim["result"], "devices"), without(cpu["result"], "devices"))
        staged = sim["staged"]
        assert staged["collectives"] >= 40
        assert staged["to_host_bytes"] > 0 and staged["to_device_bytes"] > 0
    # ranks' shared results agree with each other too (all_reduce, all_gather ...)
    r0, r1 = (result(runs, "sim", "collectives", r)["result"] for r in range(WORLD))
    assert torch.equal(r0["all_reduce.AVG.torch.float32"], r1["all_reduce.AVG.torch.float32"])
    assert_identical(r0["all_gather"], r1["all_gather"])
    assert r0["recv_anysource.src"] == 1


def test_async_handles_complete_after_the_peer_and_carry_sim_tensors(runs):
    sim0 = result(runs, "sim", "async_handles", 0)["result"]
    assert sim0["completed_before_peer"] is False  # the peer joins a second later
    for rank in range(WORLD):
        sim = result(runs, "sim", "async_handles", rank)["result"]
        cpu = result(runs, "cpu", "async_handles", rank)["result"]
        assert sim["wait"] is True and sim["completed_after_wait"] is True
        assert sim["future_value_is_tensor"] is True and sim["future_value_device"] == "sim"
        assert sim["irecv_completed"] is True
        keys = ("all_reduce", "chained", "all_gather_into_tensor", "reduce_scatter_tensor", "irecv")
        assert_identical({k: sim[k] for k in keys}, {k: cpu[k] for k in keys})


def test_failures_surface_at_wait(runs):
    sim0 = result(runs, "sim", "faults", 0)["result"]
    assert sim0["timeout_error"] is not None and "Timed out" in sim0["timeout_error"]
    for rank in range(WORLD):
        sim = result(runs, "sim", "faults", rank)["result"]
        cpu = result(runs, "cpu", "faults", rank)["result"]
        assert "can't be cast to the desired output type Long" in sim["int_avg_error"]
        assert_identical(sim["after"], cpu["after"])  # the group still works


def _assert_training_matches(runs, scenario, pick):
    for rank in range(WORLD):
        sim = pick(result(runs, "sim", scenario, rank)["result"])
        cpu = pick(result(runs, "cpu", scenario, rank)["result"])
        assert sim["device"] == "sim"
        assert_identical(sim["losses"], cpu["losses"], f"{scenario} rank {rank} losses")
        assert_identical(sim["params"], cpu["params"], f"{scenario} rank {rank} params")
    p0, p1 = (pick(result(runs, "sim", scenario, r)["result"])["params"] for r in range(WORLD))
    assert_identical(p0, p1, f"{scenario}: ranks' parameters")


@pytest.mark.parametrize("variant", ["default", "hook"])
def test_ddp_trains_like_gloo_on_cpu(runs, variant):
    _assert_training_matches(runs, "ddp", lambda r: r[variant])
    losses = result(runs, "sim", "ddp", 0)["result"][variant]["losses"]
    assert not torch.equal(losses[0], losses[-1])  # it did train


def test_fsdp2_fully_shard_trains_like_gloo_on_cpu(runs):
    _assert_training_matches(runs, "fsdp2", lambda r: r)
    shards = [result(runs, "sim", "fsdp2", r)["result"]["local_shards"][0] for r in range(WORLD)]
    assert not torch.equal(shards[0], shards[1])  # each rank holds its own shard


def test_dtensor_ops_on_a_sim_mesh(runs):
    for rank in range(WORLD):
        sim = result(runs, "sim", "dtensor", rank)["result"]
        cpu = result(runs, "cpu", "dtensor", rank)["result"]
        assert sim["device"] == "sim" and sim["matmul_placements"] == "(Replicate(),)"
        assert_identical(without(sim, "device"), without(cpu, "device"))


@pytest.mark.parametrize("mode", ["sim", "simonly"])
def test_dcp_saves_and_loads_a_sharded_state_dict(runs, mode):
    for rank in range(WORLD):
        sim = result(runs, mode, "dcp", rank)["result"]
        cpu = result(runs, "cpu", "dcp", rank)["result"]
        assert sim["device"] == "sim"
        assert any(f.endswith(".distcp") for f in sim["files"]) and ".metadata" in sim["files"]
        assert not all(torch.equal(sim["before"][k], sim["saved"][k]) for k in sim["saved"])
        assert_identical(sim["after"], sim["saved"])
        assert_identical(sim["saved"], cpu["saved"])


# -- one process ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def installed():
    import flagos_torchfl.sim as fsim
    from flagos_torchfl.sim.integration import collectives

    fsim.install(num_devices=2)
    collectives.register("sim", "simccl")
    return collectives


@pytest.fixture
def one_rank_group(installed):
    import torch.distributed as dist

    def make(backend: str):
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=datetime.timedelta(seconds=30))
        return dist

    yield make
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_register_is_idempotent_and_names_the_default_backend(installed):
    import torch.distributed as dist

    installed.register("sim", "simccl")
    installed.register("sim", "hccl")
    assert installed.registered() == ("sim", frozenset({"simccl", "hccl"}))
    assert dist.Backend.default_device_backend_map["sim"] == "simccl"
    assert set(dist.Backend.backend_capability["hccl"]) == {"sim"}
    assert len(installed.STAGED_OPS) == 19


@pytest.mark.parametrize("device_type, name, message", [
    ("sim", "gloo", "one of torch's own"),
    ("sim", "nccl", "one of torch's own"),
    ("sim", "sim:x", "cannot contain"),
    ("sim", "", "non-empty string"),
    ("npu", "hccl", "already registered for device type 'sim'"),
])
def test_register_refuses_bad_input(installed, device_type, name, message):
    from flagos_torchfl.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        installed.register(device_type, name)


def test_bytes_staged_counts_both_directions_exactly(one_rank_group, installed):
    dist = one_rank_group("cpu:gloo,sim:simccl")
    installed.reset()
    t = torch.arange(10, dtype=torch.float32, device="sim")
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    assert torch.equal(t.cpu(), torch.arange(10, dtype=torch.float32))
    assert installed.stats() == {"to_host_bytes": 40, "to_device_bytes": 40, "collectives": 1}
    out = torch.empty(10, device="sim")
    dist.all_gather_into_tensor(out, t)  # the output is written, never read: 40 + 40 more
    assert installed.bytes_staged() == 160
    cpu = torch.ones(3)
    dist.all_reduce(cpu)  # CPU tensors go to the group's cpu backend, unstaged
    assert installed.bytes_staged() == 160
    installed.reset()
    assert installed.bytes_staged() == 0


def test_premul_sum_is_refused_with_a_clear_error(one_rank_group):
    dist = one_rank_group("simccl")
    t = torch.ones(2, device="sim")
    with pytest.raises(ValueError, match="PREMUL_SUM is not supported"):
        dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))


def test_a_group_without_a_sim_backend_says_how_to_make_one(one_rank_group):
    dist = one_rank_group("cpu:gloo")
    with pytest.raises(RuntimeError, match=r"init_process_group\('cpu:gloo,sim:NAME'\)"):
        dist.all_reduce(torch.ones(2, device="sim"))
