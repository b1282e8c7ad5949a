"""A real program that graphs its decoding, run by itself under ``run`` on cpu, sim and a profile:
Hugging Face ``generate()`` with ``cache_implementation="static"`` and the forward compiled with
``mode="reduce-overhead"`` (a random-weight Llama made from a config) decodes eager's tokens."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("transformers")

PROGRAM = textwrap.dedent("""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).cuda().eval()
    ids = torch.tensor([[1, 5, 9, 3]], device="cuda")
    eager = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    compiled = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
    print("TOKENS", eager.tolist() == compiled.tolist(), compiled.shape[1])
""")


@pytest.mark.full
@pytest.mark.parametrize("where", [["--backend", "cpu"], ["--backend", "sim"], ["--profile", "ascend"]],
                         ids=["cpu", "sim", "ascend"])
def test_static_cache_generation_compiled_reduce_overhead_decodes_eagers_tokens(tmp_path, where):
    script = tmp_path / "generate_static.py"
    script.write_text(PROGRAM)
    proc = subprocess.run([sys.executable, "-m", "flagos_torchfl", "run", *where, str(script)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TOKENS True 10" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
