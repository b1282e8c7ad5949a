"""CUDA-written distributed programs (tests/e2e/clients), unchanged, with 2 processes
through ``python -m flagos_torchfl run -- torchrun --nproc_per_node=2 ...`` on the cpu backend
and on sim, against the same program run plainly with gloo on CPU tensors (its ``--cpu`` mode).

The cpu backend runs the reference's own kernels and gloo: bit-identical. On sim the tensors
live on the simulated device, operators it lacks are routed, and collectives stage through host
memory: losses and parameters within 1e-6 relative. Every launch runs in the module fixture,
four at a time, so the module's wall time is that of its slowest launches. A client that needs
what the torch under test lacks (:data:`NEEDS`, compat features; the sim's own floor on sim) is
not launched, and its cases are skipped with the reason.
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flagos_torchfl import compat
from tests.helpers import ROOT, clean_env, free_port, run_tree

CLIENTS = Path(__file__).parent / "clients"
TIMEOUT = 400
HAS_ACCELERATE = importlib.util.find_spec("accelerate") is not None
ACCELERATE_SKIP = 'accelerate is not installed (pip install -e ".[realclients]")'
#: client -> the compat features of the torch under test it needs, run plainly as well
NEEDS = {"ddp_snapshot": (), "ddp_dcp": (), "ddp_unused": (), "mp_spawn_ddp": (), "accelerate_torchrun": (),
         "fsdp2_dcp": ("device_mesh", "fsdp2", "dcp_state_dict"),
         "tensor_parallel": ("device_mesh", "fsdp2"),
         "fsdp1_device_id": ("fsdp_cpu",),  # FSDP1 on CPU tensors: the cpu backend and the reference
         "accelerator_gate": ("accelerator", "device_mesh", "fsdp2"),
         "premul_sum": ("device_mesh", "fsdp2")}
#: job names that are not a client's name
JOB_CLIENTS = {"ddp": "ddp_snapshot"}


def client_marks(client: str, backend: str) -> list:
    """The markers that skip ``client``'s cases on ``backend`` where this torch cannot run them."""
    marks = [pytest.mark.torch_feature(name) for name in NEEDS[client]]
    return marks + [pytest.mark.needs_sim] if backend == "sim" else marks


def needing(client: str, backend: str):
    """A test decorator: :func:`client_marks` of ``client`` on ``backend``."""
    def decorate(test):
        for mark in client_marks(client, backend):
            test = mark(test)
        return test

    return decorate


def runnable(client: str, backend: str) -> bool:
    needs = NEEDS[client] + (("python_privateuse1_backend",) if backend == "sim" else ())
    return all(compat.has(name) for name in needs)


def _job_runnable(name: str) -> bool:
    job, _, mode = name.partition(".")
    return runnable(JOB_CLIENTS.get(job, job), "cpu" if mode in ("ref", "cpu") else "sim")


def _env(extra=None) -> dict:
    env = clean_env(extra)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    return env


def _torchrun(*args: str) -> list:
    """torchrun with 2 processes on a port of its own (launches run side by side)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
            f"--master_port={free_port()}", *args]


def _run(argv, env=None) -> subprocess.CompletedProcess:
    """Run ``argv``; past TIMEOUT its whole tree (launcher, agents, ranks) is killed."""
    return run_tree(argv, _env(env), TIMEOUT)


def _launched(backend: str, argv, extra=None):
    return _run([sys.executable, "-m", "flagos_torchfl", "run", "--", *argv],
                env={"FL_BACKEND": backend, **(extra or {})})


def _two_agents(script_args, out: Path):
    """Two torchrun agents (``--nnodes=2``, c10d rendezvous), each under the launcher, on sim."""
    endpoint = f"127.0.0.1:{free_port()}"
    argv = [sys.executable, "-m", "flagos_torchfl", "run", "--", sys.executable, "-m",
            "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1", "--rdzv_backend=c10d",
            f"--rdzv_endpoint={endpoint}", "--rdzv_id=two-agents", *script_args]
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(lambda _: run_tree(argv, _env({"FL_BACKEND": "sim"}), TIMEOUT,
                                                 merge_stderr=True), range(2)))
    outputs = [p.stdout for p in done]
    code = next((p.returncode for p in done if p.returncode), 0)
    return subprocess.CompletedProcess(argv, code, "\n".join(outputs), "")


def _jobs(root: Path) -> dict:
    """name -> (callable returning a CompletedProcess, output folder). Snapshot runs are chained."""
    def out(name):
        folder = root / name
        folder.mkdir(parents=True)
        return folder

    def ddp(name, runner):
        folder = out(name)
        snapshot = str(folder / "snapshot.pt")
        script = str(CLIENTS / "ddp_snapshot.py")

        def go():
            first = runner(_torchrun(script, "2", "2", snapshot, str(folder)))
            if first.returncode != 0:
                return first
            second = runner(_torchrun(script, "4", "2", snapshot, str(folder)))
            second.stdout = first.stdout + second.stdout
            second.stderr = first.stderr + second.stderr
            return second

        return go, folder

    jobs = {}
    ref = out("ddp.ref")
    jobs["ddp.ref"] = (lambda: _run(_torchrun(str(CLIENTS / "ddp_snapshot.py"), "4", "2",
                                              str(ref / "snap.pt"), str(ref), "--cpu")), ref)
    jobs["ddp.cpu"] = ddp("ddp.cpu", lambda argv: _launched("cpu", argv))
    jobs["ddp.sim"] = ddp("ddp.sim", lambda argv: _launched("sim", argv))
    agents = out("ddp.agents")
    jobs["ddp.agents"] = (lambda: _two_agents([str(CLIENTS / "ddp_snapshot.py"), "4", "2",
                                               str(agents / "snap.pt"), str(agents)], agents), agents)
    for name, args in (("ddp_dcp", ["{out}/ckpt"]), ("ddp_unused", []), ("fsdp2_dcp", ["{out}/ckpt"]), ("tensor_parallel", []),
                       ("fsdp1_device_id", []), ("accelerate_torchrun", [])):
        if name == "accelerate_torchrun" and not HAS_ACCELERATE:
            continue
        script = str(CLIENTS / f"{name}.py")
        for mode in ("ref", "cpu", "sim"):
            folder = out(f"{name}.{mode}")
            argv = _torchrun(script, *[a.format(out=folder) for a in args], str(folder))
            if mode == "ref":
                jobs[f"{name}.ref"] = ((lambda argv=argv: _run(argv + ["--cpu"])), folder)
            elif (name, mode) == ("fsdp2_dcp", "sim"):  # also prints the routing report
                jobs[f"{name}.{mode}"] = ((lambda argv=argv: _run(
                    [sys.executable, "-m", "flagos_torchfl", "run", "--report", "--", *argv],
                    env={"FL_BACKEND": "sim"})), folder)
            else:
                jobs[f"{name}.{mode}"] = ((lambda argv=argv, mode=mode: _launched(mode, argv)), folder)
    folder = out("ddp_dcp.ascend910a")  # a sim profile: the chip's collective ("hccl") and device ("npu")
    argv = _torchrun(str(CLIENTS / "ddp_dcp.py"), str(folder / "ckpt"), str(folder))
    jobs["ddp_dcp.ascend910a"] = ((lambda argv=argv: _run(
        [sys.executable, "-m", "flagos_torchfl", "run", "--profile", "ascend:910a", "--", *argv])), folder)
    for job, chip in (("premul_sum.sim", ["--backend", "sim"]), ("premul_sum.cpu", ["--backend", "cpu"]),
                      ("premul_sum.ascend", ["--profile", "ascend"])):
        folder = out(job)
        argv = _torchrun(str(CLIENTS / "premul_sum.py"), str(folder))
        jobs[job] = ((lambda argv=argv, chip=chip: _run(
            [sys.executable, "-m", "flagos_torchfl", "run", *chip, "--", *argv])), folder)
    spawn = str(CLIENTS / "mp_spawn_ddp.py")
    for mode in ("ref", "cpu", "sim"):
        folder = out(f"mp_spawn_ddp.{mode}")
        if mode == "ref":
            jobs["mp_spawn_ddp.ref"] = ((lambda f=folder: _run([sys.executable, spawn, str(f), "--cpu"])), folder)
        else:
            devices = {"FL_CPU_DEVICES": "2", "FL_SIM_DEVICES": "2"}
            jobs[f"mp_spawn_ddp.{mode}"] = ((lambda f=folder, m=mode: _run(
                [sys.executable, "-m", "flagos_torchfl", "run", spawn, str(f)], env={"FL_BACKEND": m, **devices})), folder)
    for mode in ("cpu", "sim"):
        folder = out(f"accelerator_gate.{mode}")
        jobs[f"accelerator_gate.{mode}"] = ((lambda f=folder, m=mode: _launched(
            m, _torchrun(str(CLIENTS / "accelerator_gate.py"), str(f)))), folder)
    return jobs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    jobs = {name: job for name, job in _jobs(tmp_path_factory.mktemp("clients")).items()
            if _job_runnable(name)}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(job) for name, (job, _) in jobs.items()}
        return {name: (futures[name].result(), folder) for name, (_, folder) in jobs.items()}


def records(runs, name: str, client: str) -> dict:
    """rank -> the JSON record the client's ranks wrote; fails with the run's output if any is
    missing or the run did not exit 0 (a job that finished must not abort or hang at exit)."""
    proc, folder = runs[name]
    found = {}
    for rank in (0, 1):
        path = folder / f"{client}.rank{rank}.json"
        if not path.exists() or proc.returncode != 0:
            what = "finished but the run exited" if path.exists() else "wrote no record, exit"
            pytest.fail(f"{name}: rank {rank} {what} {proc.returncode}\n--- stdout\n"
                        f"{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}")
        found[rank] = json.loads(path.read_text())
    return found


def flat(values) -> list:
    if isinstance(values, dict):
        return [x for key in sorted(values, key=int) for x in flat(values[key])]
    if isinstance(values, list):
        return [x for v in values for x in flat(v)]
    return [values]


def assert_trained_like(got: dict, ref: dict, exact: bool, what: str):
    for rank in (0, 1):
        for key in ("losses", "params"):
            expected = ref[rank][key]
            if isinstance(expected, dict):  # per epoch: a resumed run holds the later epochs only
                expected = {epoch: expected[epoch] for epoch in got[rank][key]}
            a, b = flat(got[rank][key]), flat(expected)
            assert len(a) == len(b) and a, f"{what} rank {rank} {key}"
            if exact:
                assert a == b, f"{what} rank {rank} {key} differ"
            else:
                assert a == pytest.approx(b, rel=1e-6, abs=1e-7), f"{what} rank {rank} {key}"
    assert flat(got[0]["params"]) == flat(got[1]["params"]), f"{what}: ranks' parameters differ"


ACCELERATE = pytest.mark.skipif(not HAS_ACCELERATE, reason=ACCELERATE_SKIP)
CASES = [pytest.param(client, job, backend, id=f"{client}-{job}-{backend}",
                      marks=client_marks(client, backend) + ([ACCELERATE] if client == "accelerate_torchrun" else []))
         for client, job in (("ddp_snapshot", "ddp"), ("ddp_dcp", "ddp_dcp"), ("ddp_unused", "ddp_unused"),
                             ("fsdp2_dcp", "fsdp2_dcp"),
                             ("tensor_parallel", "tensor_parallel"), ("fsdp1_device_id", "fsdp1_device_id"),
                             ("mp_spawn_ddp", "mp_spawn_ddp"), ("accelerate_torchrun", "accelerate_torchrun"))
         for backend in ("cpu", "sim")]
BACKENDS = {client: [pytest.param(b, marks=client_marks(client, b)) for b in ("cpu", "sim")] for client in NEEDS}


@pytest.mark.parametrize("client, job, backend", CASES)
def test_client_trains_like_plain_gloo(runs, client, job, backend):
    got = records(runs, f"{job}.{backend}", client)
    ref = records(runs, f"{job}.ref", client)
    assert_trained_like(got, ref, exact=backend == "cpu", what=f"{client} on {backend}")
    for rank in (0, 1):
        device = got[rank].get("param_device", got[rank]["device"])
        assert device == ("cpu" if backend == "cpu" else f"sim:{rank}"), device


@pytest.mark.parametrize("backend", BACKENDS["ddp_unused"])
def test_ddp_finds_the_unused_parameters_of_each_step(runs, backend):
    """``find_unused_parameters=True``: the auxiliary head is updated exactly in the steps that
    used it (the reducer's map of used parameters, pinned host memory on an accelerator)."""
    for rank, record in records(runs, f"ddp_unused.{backend}", "ddp_unused").items():
        assert record["aux_changed"] == [True, False, False, True, False, False], rank


@pytest.mark.parametrize("backend", BACKENDS["ddp_snapshot"])
def test_ddp_snapshot_resumes_from_the_snapshot(runs, backend):
    proc, _ = runs[f"ddp.{backend}"]
    assert "Resuming training from snapshot at Epoch 2" in proc.stdout
    assert sorted(records(runs, f"ddp.{backend}", "ddp_snapshot")[0]["losses"]) == ["2", "3"]


@pytest.mark.parametrize("backend", BACKENDS["ddp_dcp"])
def test_the_nccl_if_available_idiom_picks_the_chip_s_collective(runs, backend):
    """``"nccl" if dist.is_nccl_available() else "gloo"``: "nccl", served by the chip's library
    (on sim its own; on cpu gloo, torch's answer for CPU tensors)."""
    got = records(runs, f"ddp_dcp.{backend}", "ddp_dcp")
    assert [got[r]["backend"] for r in (0, 1)] == [{"cpu": "gloo", "sim": "simccl"}[backend]] * 2


@pytest.mark.needs_sim
def test_ddp_with_the_idiom_trains_on_the_ascend_910a_profile(runs):
    got = records(runs, "ddp_dcp.ascend910a", "ddp_dcp")
    assert_trained_like(got, records(runs, "ddp_dcp.ref", "ddp_dcp"), exact=False, what="ddp_dcp on ascend:910a")
    assert [(got[r]["device"], got[r]["backend"]) for r in (0, 1)] == [("npu:0", "hccl"), ("npu:1", "hccl")]
    assert all(got[r]["loaded_equals_saved"] for r in (0, 1))


PREMUL_SUM_CALLS = ("all_reduce", "reduce_scatter", "fsdp_divide_factor")


@pytest.mark.parametrize("backend", BACKENDS["premul_sum"])
def test_premul_sum_reduces_as_nccl_defines_it(runs, backend):
    """NCCL's PREMUL_SUM (each input times the factor, then summed) on the cpu backend and the
    sim, whose collectives are gloo's, which refuses it: all_reduce, reduce_scatter_tensor (its
    input kept) and FSDP2's reduce-scatter under ``set_gradient_divide_factor`` (torchtitan's)."""
    for rank, record in records(runs, f"premul_sum.{backend}", "premul_sum").items():
        assert record["device"] == ("cpu" if backend == "cpu" else f"sim:{rank}")
        for call in PREMUL_SUM_CALLS:
            assert record[call].get("got") == record[call]["expected"], (call, record[call])
        assert record["reduce_scatter"]["input_kept"] is True


@needing("premul_sum", "sim")
def test_premul_sum_is_refused_on_the_ascend_profile_as_hccl_has_none(runs):
    for rank, record in records(runs, "premul_sum.ascend", "premul_sum").items():
        assert record["device"] == f"npu:{rank}"
        for call in PREMUL_SUM_CALLS:
            assert "PREMUL_SUM is not supported by hccl on npu tensors" in record[call]["error"], call


@pytest.mark.parametrize("backend", BACKENDS["ddp_dcp"])
def test_ddp_dcp_resumes_where_it_saved(runs, backend):
    """The state loaded from the distributed checkpoint is the saved one, momentum included: the
    loaded model trains on exactly as the saved model does."""
    for rank, record in records(runs, f"ddp_dcp.{backend}", "ddp_dcp").items():
        assert record["loaded_equals_saved"] is True, rank
        assert record["losses"][3:] == record["straight_losses"], rank
        assert record["params"] == record["straight_params"], rank


@pytest.mark.needs_sim
def test_two_torchrun_agents_train_ddp_on_sim(runs):
    got = records(runs, "ddp.agents", "ddp_snapshot")
    ref = records(runs, "ddp.ref", "ddp_snapshot")
    assert_trained_like(got, ref, exact=False, what="two agents on sim")
    assert got[0]["device"] == got[1]["device"] == "sim:0"  # one device per "node"


@pytest.mark.parametrize("backend", BACKENDS["mp_spawn_ddp"])
def test_mp_spawn_loads_the_checkpoint_with_a_cuda_map_location_dict(runs, backend):
    devices = ["sim:0", "sim:1"] if backend == "sim" else ["cpu", "cpu"]
    got = records(runs, f"mp_spawn_ddp.{backend}", "mp_spawn_ddp")
    assert [got[r]["loaded_devices"] for r in (0, 1)] == [[d] for d in devices]
    assert got[0]["world_size"] == 2  # torch.cuda.device_count() answered FL_*_DEVICES


@needing("accelerator_gate", "sim")
def test_accelerator_gated_script_trains_on_sim(runs):
    sim = records(runs, "accelerator_gate.sim", "accelerator_gate")
    assert sim[0]["device_type"] == "sim" and sim[0]["params"] == sim[1]["params"]


@needing("accelerator_gate", "cpu")
def test_accelerator_gated_script_says_why_not_on_cpu(runs):
    proc, folder = runs["accelerator_gate.cpu"]
    assert proc.returncode == 0 and not list(folder.glob("*.json"))
    assert "Unable to locate sufficient 2 gpus" in proc.stdout
    hints = [line for line in proc.stderr.splitlines() if "asked torch.accelerator" in line]
    assert len(hints) == 2 and "FL_BACKEND=sim" in hints[0]  # one per rank


@needing("fsdp2_dcp", "sim")
def test_routing_report_counts_the_host_bytes_collectives_staged(runs):
    proc, _ = runs["fsdp2_dcp.sim"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("collectives staged through host memory")]
    assert len(lines) == 2, proc.stderr[-3000:]  # one per rank
    calls = int(lines[0].split(": ")[1].split(" calls")[0])
    assert calls > 10 and " 0 B to host" not in lines[0]
