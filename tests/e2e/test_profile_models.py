"""Transformers BERT, GPT-2 and ResNet written for CUDA (random init, dropout off) train 3 steps
on each sim profile with the losses of the CPU run (within 1e-5 relative, as on the plain sim),
and each verdict names exactly the operators the reviewed example in docs/profiles.md names.
The example script's Ascend verdict is checked the same way."""
from __future__ import annotations

import functools
import json
import re

import pytest

from tests.helpers import ROOT, run_python

MODELS = ROOT / "tests" / "routing" / "models"
DOC = ROOT / "docs" / "profiles.md"


@functools.lru_cache(maxsize=None)
def cpu_losses(model: str) -> tuple:
    done = run_python(["-m", "flagos_torchfl", "run", str(MODELS / f"{model}_cuda.py")],
                      env={"FL_BACKEND": "cpu"}, timeout=600)
    return tuple(losses(done))


def losses(done) -> list:
    assert done.returncode == 0, done.stderr[-3000:]
    line = [l for l in done.stdout.splitlines() if l.startswith("LOSSES ")]
    assert line, done.stdout[-2000:]
    return json.loads(line[-1][len("LOSSES "):])


def verdict_json(stderr: str) -> dict:
    return json.loads(stderr[stderr.rindex('{\n "backend"'):])


def documented(section: str) -> set:
    """(operator, route) pairs the verdict block under ``### section`` lists (empty when it says
    every operator ran natively)."""
    text = DOC.read_text("utf-8")
    found = re.search(rf"^### {re.escape(section)}\n+```\n(.*?)```", text, re.S | re.M)
    assert found, f"docs/profiles.md has no verdict for {section}"
    block = found.group(1)
    pairs = set(re.findall(r"^  (aten::\S+)\s+(library|composite|fallback|unsupported)\s", block, re.M))
    assert pairs or "every operator ran natively" in block
    return pairs


def ran(data: dict) -> set:
    return {(o["op"], o["route"]) for o in data["operators"]}


@pytest.mark.parametrize("profile", ["ascend", "cambricon", "mthreads"])
@pytest.mark.parametrize("model", ["bert", "gpt2", "resnet"])
def test_cuda_model_trains_on_the_profile_like_on_the_cpu(model, profile):
    done = run_python(["-m", "flagos_torchfl", "run", "--profile", profile, "--json",
                       str(MODELS / f"{model}_cuda.py")], timeout=900)
    got, want = losses(done), cpu_losses(model)
    assert len(got) == 3
    for a, b in zip(got, want):
        assert abs(a - b) <= 1e-5 * abs(b), (got, want)
    data = verdict_json(done.stderr)
    assert data["profile"] == profile and data["steps"] == 3 and data["routes"]["native"]["calls"] > 0
    assert ran(data) == documented(f"{model} on {profile}")


def test_the_example_on_ascend_names_what_torch_npu_would_not_run_natively():
    done = run_python(["-m", "flagos_torchfl", "run", "--profile", "ascend", "--report",
                       str(ROOT / "examples" / "train_cuda.py")], timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    text = done.stderr[done.stderr.index("verdict for ascend"):]
    assert text.startswith("verdict for ascend (sim-ascend, device npu; operator table of torch-npu 2.14.0), "
                           "per optimizer step (20 steps):")
    pairs = set(re.findall(r"^  (aten::\S+)\s+(library|composite|fallback|unsupported)\s", text, re.M))
    assert pairs == documented("examples/train_cuda.py on ascend") and pairs
