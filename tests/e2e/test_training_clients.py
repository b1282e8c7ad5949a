"""Real training programs, unchanged, through ``python -m flagos_torchfl run``, compared with the
same program run plainly on this CPU-only machine: transformers ``Trainer`` (bf16, checkpoint
resume) on cpu and sim, ``accelerate launch --multi_gpu``, Lightning ``accelerator="gpu"`` with
one device and with ``devices=2, strategy="ddp"``."""
import pytest

from tests.e2e.realclients import by_rank, client, records, requires, run_launched, run_plain


@pytest.fixture(scope="module")
def trainer_plain(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainer_plain")
    return records(run_plain([client("hf_trainer.py"), str(out), "--cpu"]), "hf_trainer")[0]


@requires("transformers", "accelerate")
def test_hf_trainer_bf16_resume_on_cpu_backend_equals_plain_cpu(trainer_plain, tmp_path):
    got = records(run_launched([client("hf_trainer.py"), str(tmp_path)]), "hf_trainer")[0]
    assert got["device"].startswith("cuda")  # the script sees a GPU ...
    assert got["param_device"] == "cpu"      # ... and its tensors live on the host
    assert got["full"] == pytest.approx(trainer_plain["full"], rel=1e-6)
    assert got["resumed"] == pytest.approx(got["full"], rel=1e-6)
    assert len(got["full"]) == 4


@requires("transformers", "accelerate")
def test_hf_trainer_bf16_resume_on_sim(trainer_plain, tmp_path):
    got = records(run_launched([client("hf_trainer.py"), str(tmp_path)], env={"FL_BACKEND": "sim"}),
                  "hf_trainer")[0]
    assert got["param_device"] == "sim:0"
    assert got["resumed"] == pytest.approx(got["full"], rel=1e-6)
    # sim's autocast casts nothing (no AutocastPrivateUse1 kernels): float32 against CPU bfloat16
    assert got["full"] == pytest.approx(trainer_plain["full"], rel=2e-2)


ACCELERATE_LAUNCH = ["accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                     "--mixed_precision", "no", "--dynamo_backend", "no", client("accelerate_ddp.py")]


@pytest.fixture(scope="module")
def accelerate_plain():
    return by_rank(records(run_plain(ACCELERATE_LAUNCH, env={"ACCELERATE_USE_CPU": "true"}, command=True),
                           "accelerate"))


@requires("accelerate")
@pytest.mark.parametrize("env", [{}, {"FL_BACKEND": "sim"}, {"FL_BACKEND": "sim", "FL_SIM_PROFILE": "ascend"}],
                         ids=["cpu", "sim", "sim-ascend"])
def test_accelerate_launch_multi_gpu_two_processes(accelerate_plain, env):
    """``accelerate launch --multi_gpu``: two ranks of one process group on the backend's devices,
    training as the plain CPU run does (accelerate 1.16 asks ``torch.accelerator`` for its
    device: the ``accelerate_device`` patch)."""
    plain = accelerate_plain
    got = by_rank(records(run_launched(["--", *ACCELERATE_LAUNCH], env=env), "accelerate"))
    assert sorted(got) == [0, 1] and sorted(plain) == [0, 1]
    for rank in (0, 1):
        assert got[rank]["world"] == 2
        assert got[rank]["device"] == f"cuda:{rank}"
        assert got[rank]["distributed_type"] == "DistributedType.MULTI_GPU"
        assert got[rank]["losses"] == pytest.approx(plain[rank]["losses"], rel=1e-6)
        assert got[rank]["weight_sum"] == pytest.approx(plain[rank]["weight_sum"], rel=1e-6)


@requires("lightning")
def test_lightning_accelerator_gpu_one_device_on_cpu_backend():
    plain = records(run_plain([client("lightning_fit.py"), "cpu", "1"]), "lightning")[0]
    got = records(run_launched([client("lightning_fit.py"), "gpu", "1"]), "lightning")[0]
    assert got["device"] == "cuda:0" and got["world"] == 1
    assert got["losses"] == pytest.approx(plain["losses"], rel=1e-6)
    assert got["weight_sum"] == pytest.approx(plain["weight_sum"], rel=1e-6)


@requires("lightning")
def test_lightning_ddp_two_devices_with_run_devices_on_cpu_backend():
    plain = by_rank(records(run_plain([client("lightning_fit.py"), "cpu", "2", "ddp"], timeout=400),
                            "lightning"))
    got = by_rank(records(run_launched(["--devices", "2", client("lightning_fit.py"), "gpu", "2", "ddp"],
                                       timeout=400), "lightning"))
    assert sorted(got) == [0, 1]
    for rank in (0, 1):
        assert got[rank]["world"] == 2 and got[rank]["device"] == f"cuda:{rank}"
        assert got[rank]["losses"] == pytest.approx(plain[rank]["losses"], rel=1e-6)
        assert got[rank]["weight_sum"] == pytest.approx(plain[rank]["weight_sum"], rel=1e-6)
