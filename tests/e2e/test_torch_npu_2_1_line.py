"""Ascend's long-lived torch-npu 2.1 line (2.1.0.post17 from the package index, which pins
``torch==2.1.0+cpu``) on a machine without the CANN toolkit, on whatever torch is under test (the
floor, 2.1.2, in CI's 2.1 leg; a newer one in the main leg). Its plugin predates torch's device
auto-load, so ``import torch`` is unaffected; the package's command line and launcher say why the
chip cannot be used, and a CUDA-written script trains on the cpu with the same losses as without
the wheel."""
from __future__ import annotations

import json
import textwrap

import pytest
import torch

from tests.helpers import prepend_path, run_python
from tests.wheels import site

WHEEL = "2.1.0.post17"
TORCH = torch.__version__.split("+")[0]

TRAIN = textwrap.dedent("""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(8, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for step in range(4):
        x = torch.randn(3, 1, 4, 4, device="cuda")
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        print("loss", step, repr(loss.item()))
""")


@pytest.fixture(scope="module")
def npu21():
    return site("torch-npu", WHEEL)


def cli(args, folder=None, **env):
    if folder is not None:
        env = prepend_path(dict(env), "PYTHONPATH", folder)
    return run_python(["-m", "flagos_torchfl", *args], env=env, timeout=300)


def test_detect_names_the_torch_it_pins_and_the_missing_cann(npu21):
    proc = cli(["detect", "--json"], npu21)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    row = next(row for row in data["backends"] if row["name"] == "ascend")
    assert row["status"] == "unavailable"
    reason = row["reason"]
    assert f"torch_npu {WHEEL} requires torch (==2.1.0+cpu) but torch {TORCH} is installed" in reason, reason
    assert "libhccl.so is missing" in reason and "the CANN toolkit" in reason
    assert data["auto_select"]["backend"] == "cpu"


def test_a_cuda_script_trains_on_cpu_as_without_the_wheel(npu21, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    plain = cli(["run", "--backend", "cpu", str(script)])
    beside = cli(["run", str(script)], npu21)
    assert plain.returncode == 0 and beside.returncode == 0, plain.stderr + beside.stderr
    losses = [line for line in beside.stdout.splitlines() if line.startswith("loss ")]
    assert len(losses) == 4 and losses == [line for line in plain.stdout.splitlines() if line.startswith("loss ")]
    warnings = [line for line in beside.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "running on cpu: ascend skipped" in warnings[0], beside.stderr


def test_asking_for_ascend_is_one_clear_error(npu21, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    proc = cli(["run", "--backend", "ascend", str(script)], npu21)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("flagos_torchfl: cannot activate backend ascend: BackendUnavailableError")
    assert "requires torch (==2.1.0+cpu)" in proc.stderr and "libhccl.so is missing" in proc.stderr
    assert "loss " not in proc.stdout
