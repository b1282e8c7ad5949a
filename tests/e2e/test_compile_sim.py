"""``torch.compile`` and random state in programs nobody here wrote, through
``python -m flagos_torchfl run`` on cpu, sim and the ascend profile:

- a nanoGPT-style trainer with its default configuration (bf16 ``autocast("cuda")`` +
  ``torch.compile``, fused AdamW) and in float32: compiled losses within 2e-2 (bf16) / 1e-4 (fp32)
  relative of the eager ones of the same run;
- a compiled transformers GPT-2 (forward + backward) on sim and on the ascend profile;
- transformers' ``gradient_checkpointing_enable()`` with dropout on: the same gradients as
  without checkpointing (the recomputed forward replays the device generator's masks).

Every launch runs in the module fixture, three at a time (Inductor compiles C++ with the host
compiler; the launches are what the module's wall time is made of).
"""
from __future__ import annotations

import concurrent.futures

import pytest

from tests.e2e.realclients import client, records, run_launched, skip_unless_installed

TIMEOUT = 900
#: the fixture's seven launches (about 6 minutes with the 2 cores shared) exceed the default limit
pytestmark = pytest.mark.timeout(1800)
BACKENDS = {"cpu": {"FL_BACKEND": "cpu"}, "sim": {"FL_BACKEND": "sim"},
            "ascend": {"FL_BACKEND": "sim", "FL_SIM_PROFILE": "ascend"}}
JOBS = {f"nanogpt.{name}": ("nanogpt_train.py", env) for name, env in BACKENDS.items()}
JOBS.update({f"gpt2.{name}": ("compile_gpt2.py", BACKENDS[name]) for name in ("sim", "ascend")})
JOBS.update({f"checkpointing.{name}": ("checkpointing_dropout.py", BACKENDS[name]) for name in ("cpu", "sim")})


@pytest.fixture(scope="module")
def runs():
    skip_unless_installed("transformers")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = {name: pool.submit(run_launched, [client(script)], env, TIMEOUT)
                   for name, (script, env) in JOBS.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_nanogpt_default_config_compiled_under_bf16_autocast_trains_like_eager(runs, backend):
    got = records(runs[f"nanogpt.{backend}"], "nanogpt")[0]
    assert got["device"] == {"cpu": "cpu", "sim": "sim:0", "ascend": "npu:0"}[backend]
    for dtype, rel in (("bfloat16", 2e-2), ("float32", 1e-4)):
        eager, compiled = got[dtype]["eager"], got[dtype]["compiled"]
        assert len(eager) == len(compiled) == 3
        assert compiled == pytest.approx(eager, rel=rel), (dtype, eager, compiled)
    # autocast cast: the bf16 run's losses are not the float32 run's
    assert got["bfloat16"]["eager"] != got["float32"]["eager"]


@pytest.mark.parametrize("backend", ["sim", "ascend"])
def test_compiled_gpt2_forward_backward_on_sim_gives_the_eager_loss_and_gradients(runs, backend):
    got = records(runs[f"gpt2.{backend}"], "compile")[0]
    assert got["device"] == {"sim": "sim:0", "ascend": "npu:0"}[backend]
    assert got["compiled_loss"] == pytest.approx(got["eager_loss"], rel=1e-5)
    assert got["compiled_grad_norm"] == pytest.approx(got["eager_grad_norm"], rel=1e-5)


@pytest.mark.parametrize("backend", ["cpu", "sim"])
def test_gradient_checkpointing_with_dropout_gives_the_gradients_of_plain_steps(runs, backend):
    got = records(runs[f"checkpointing.{backend}"], "checkpointing")[0]
    assert got["device"] == {"cpu": "cpu", "sim": "sim:0"}[backend]
    plain, checkpointed = got["plain"], got["checkpointed"]
    assert checkpointed["losses"] == plain["losses"]
    assert checkpointed["grads"] == plain["grads"]
