"""gpt-fast's ``generate.py --compile`` (``tests/fixtures/gpt_fast``, unmodified), run by itself
under ``python -m flagos_torchfl run`` on cpu, sim and the ascend profile: the program asks
``torch.cuda.is_available()`` for its device (``"cuda"``), loads a checkpoint there, compiles
``decode_one_token`` with ``mode="reduce-overhead", fullgraph=True``, synchronises with
``torch.cuda.synchronize`` and reads ``torch.cuda.max_memory_reserved``. Greedy decoding
(``--top_k 1``) gives the tokens of the same command without ``--compile`` and of plain torch on
the CPU.

The inputs fit the program as it is: its smallest model is ``stories15M`` (6 layers, dim 288,
32000 tokens; ``Transformer.from_name`` reads the name from the checkpoint's folder), so the test
writes a random checkpoint of it and a 32000-word SentencePiece tokenizer (``t3`` ... ``t31999``,
the prompt ``"t5 t6 t7"``). Only 64 rows of the output layer are non-zero, scaled so the largest
logit stands clear of the next by more than bfloat16's rounding: eager and compiled kernels round
differently, and greedy decoding must not turn on that rounding.

Every launch runs in the module fixture, three at a time; Inductor's cache is the test's own, so
each compilation is a cold one.
"""
from __future__ import annotations

import concurrent.futures
import io
import re
import sys
from pathlib import Path

import pytest

from tests.e2e.realclients import run_launched, run_plain, skip_unless_installed

TIMEOUT = 900
#: seven launches, three compilations: several minutes with the 2 cores shared
pytestmark = pytest.mark.timeout(1800)
PROGRAM = Path(__file__).resolve().parents[1] / "fixtures" / "gpt_fast"
BACKENDS = {"cpu": ["--backend", "cpu"], "sim": ["--backend", "sim"], "ascend": ["--profile", "ascend"]}
PROMPT = "t5 t6 t7"
NEW_TOKENS = 6


def _write_inputs(folder: Path) -> Path:
    """A random ``stories15M`` checkpoint (bfloat16) and its tokenizer in ``folder/stories15M``;
    returns the checkpoint's path."""
    import sentencepiece
    import torch

    sys.path.insert(0, str(PROGRAM))
    try:
        from model import Transformer
    finally:
        sys.path.remove(str(PROGRAM))
    home = folder / "stories15M"
    home.mkdir()
    torch.manual_seed(0)
    model = Transformer.from_name(home.name)
    with torch.no_grad():
        weight = model.output.weight
        weight.zero_()
        weight[3:67] = torch.randn(64, weight.shape[1]) * (3 / weight.shape[1] ** 0.5)
    torch.save(model.to(torch.bfloat16).state_dict(), home / "model.pth")
    words = [f"t{i}" for i in range(3, model.config.vocab_size)]
    buffer = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(" ".join(words[i:i + 50]) for i in range(0, len(words), 50)),
        model_writer=buffer, vocab_size=model.config.vocab_size, model_type="word", minloglevel=2)
    (home / "tokenizer.model").write_bytes(buffer.getvalue())
    return home / "model.pth"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    skip_unless_installed("sentencepiece", "tiktoken")
    folder = tmp_path_factory.mktemp("gpt_fast")
    args = [str(PROGRAM / "generate.py"), "--checkpoint_path", str(_write_inputs(folder)), "--prompt", PROMPT,
            "--max_new_tokens", str(NEW_TOKENS), "--num_samples", "1", "--top_k", "1"]
    env = {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor")}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = {"plain": pool.submit(run_plain, args, env, TIMEOUT)}
        for name, where in BACKENDS.items():
            futures[f"{name}.compiled"] = pool.submit(run_launched, [*where, *args, "--compile"], env, TIMEOUT)
            futures[f"{name}.eager"] = pool.submit(run_launched, [*where, *args], env, TIMEOUT)
        return {name: f.result() for name, f in futures.items()}


def _tokens(proc) -> list:
    """The decoded sequence the program printed (the prompt and the new tokens), and that it
    compiled when asked to."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith(PROMPT)]
    assert len(lines) == 1, proc.stdout[-3000:]
    assert len(lines[0]) == len(PROMPT.split()) + NEW_TOKENS and all(re.fullmatch(r"t\d+", t) for t in lines[0])
    return lines[0]


def test_plain_torch_decodes_on_the_cpu(runs):
    assert "Using device=cpu" in runs["plain"].stdout
    assert len(set(_tokens(runs["plain"])[3:])) > 1


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_generate_compiled_reduce_overhead_decodes_the_eager_and_plain_tokens(runs, backend):
    compiled, eager = runs[f"{backend}.compiled"], runs[f"{backend}.eager"]
    assert "Using device=cuda" in compiled.stdout and "Compilation time:" in compiled.stdout
    assert _tokens(compiled) == _tokens(eager) == _tokens(runs["plain"])
