"""Real third-party models written as CUDA scripts (transformers BERT, GPT-2, ResNet; random
init) trained 3 steps through the launcher on the sim: losses equal the CPU's within 1e-5
relative, and the routing report shows what was routed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_python

MODELS = Path(__file__).resolve().parent / "models"


def losses(done) -> list:
    assert done.returncode == 0, done.stderr[-3000:]
    line = [l for l in done.stdout.splitlines() if l.startswith("LOSSES ")]
    assert line, done.stdout[-2000:]
    return json.loads(line[-1][len("LOSSES "):])


@pytest.mark.needs_sim
@pytest.mark.parametrize("script", ["bert_cuda.py", "gpt2_cuda.py", "resnet_cuda.py"])
def test_cuda_script_trains_on_the_sim_like_on_the_cpu(script):
    path = str(MODELS / script)
    on_cpu = losses(run_python(["-m", "flagos_torchfl", "run", path], env={"FL_BACKEND": "cpu"}, timeout=600))
    done = run_python(["-m", "flagos_torchfl", "run", "--report", path], env={"FL_BACKEND": "sim"}, timeout=900)
    on_sim = losses(done)
    assert len(on_sim) == 3
    for a, b in zip(on_sim, on_cpu):
        assert abs(a - b) <= 1e-5 * abs(b), (on_sim, on_cpu)
    report = done.stderr[done.stderr.index("routing report for sim"):]
    assert "composite" in report and "total by route:" in report
