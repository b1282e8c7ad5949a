"""Ultralytics YOLO trained on two GPUs (``device=[0, 1]``, its own DDP launch with
``find_unused_parameters=True``, validation under ``torch.inference_mode()``) on this machine,
which has none: refused plainly, trained under ``run --devices 2`` on the cpu backend, and on
sim with the cpu backend's results.

Ultralytics needs torchvision, and PyPI's torchvision is a CUDA build that does not load beside
the CPU torch the main leg runs: this module runs in the torch 2.14 leg of ``.ci/run``, whose
venv installs ``.[yolo]`` with torch 2.14.1 and torchvision 0.29.1 (PyPI's CUDA builds, run
without a GPU)."""
from __future__ import annotations

import importlib

import pytest

from tests.e2e.realclients import client, records, run_launched, run_plain


def _loads(name: str) -> bool:
    try:
        importlib.import_module(name)
    except Exception:  # noqa: BLE001 - torchvision beside the CPU torch raises RuntimeError
        return False
    return True


pytestmark = [
    pytest.mark.skipif(not (_loads("torchvision") and _loads("ultralytics")),
                       reason="ultralytics with a torchvision that loads beside this torch: the torch 2.14 "
                              "leg of .ci/run installs them (pip install -e '.[yolo]' with torchvision==0.29.1)"),
    pytest.mark.needs_sim,
]
TIMEOUT = 400


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("yolo_cpu")
    return records(run_launched(["--devices", "2", client("yolo_ddp.py"), str(work)],
                                env={"FL_BACKEND": "cpu"}, timeout=TIMEOUT), "yolo_ddp")[0]


def test_plain_torch_on_this_machine_refuses_two_gpus(tmp_path):
    plain = run_plain([client("yolo_ddp.py"), str(tmp_path)], timeout=TIMEOUT)
    assert plain.returncode != 0
    assert "Invalid CUDA 'device=0,1' requested" in plain.stdout + plain.stderr


def test_trains_with_ddp_on_two_cpu_devices(cpu_run):
    assert cpu_run["device_count"] == 2
    assert [round(e["epoch"]) for e in cpu_run["epochs"]] == [1, 2]
    assert all(e["train/box_loss"] > 0 and e["val/box_loss"] > 0 for e in cpu_run["epochs"])


def test_trains_on_sim_as_on_the_cpu_backend(cpu_run, tmp_path):
    sim = records(run_launched(["--devices", "2", client("yolo_ddp.py"), str(tmp_path)],
                               env={"FL_BACKEND": "sim"}, timeout=TIMEOUT), "yolo_ddp")[0]
    assert sim["device_count"] == 2
    keys = ("train/box_loss", "train/cls_loss", "train/dfl_loss", "val/box_loss", "val/cls_loss")
    for got, ref in zip(sim["epochs"], cpu_run["epochs"], strict=True):
        assert [got[k] for k in keys] == pytest.approx([ref[k] for k in keys], rel=1e-3, abs=1e-5)
    assert sim["weights_abs_sum"] == pytest.approx(cpu_run["weights_abs_sum"], rel=1e-6)
