"""Programs that graph their work, run by themselves under ``run``: on cpu, sim and a profile,
Hugging Face ``generate()`` with ``cache_implementation="static"`` and the forward compiled with
``mode="reduce-overhead"`` (a random-weight Llama made from a config) decodes eager's tokens; under
the other profiles a CUDA graph captures and replays with the chip's names."""
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


CAPTURE = textwrap.dedent("""
    import sys
    import torch

    device_type = sys.argv[1]
    x = torch.ones(4, 4, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y = x * 2 + 1
    x.fill_(3)
    graph.replay()
    own = getattr(getattr(torch, device_type), device_type.upper() + "Graph")
    print("GRAPH", torch.cuda.CUDAGraph is own, own.__name__, y.sum().item())
""")


@pytest.mark.full
@pytest.mark.parametrize("profile, device_type", [("cambricon", "mlu"), ("mthreads", "musa")])
def test_a_cuda_graph_captures_and_replays_under_each_profile_with_the_chips_names(tmp_path, profile, device_type):
    """torch_mlu's ``MLUGraph`` and torch_musa's ``MUSAGraph`` (the Ascend profile runs every case of
    :mod:`tests.redirect.graph_cases`), and the verdict counts no graph use as missing there."""
    from flagos_torchfl.tables.device_modules import missing_uses

    script = tmp_path / "capture.py"
    script.write_text(CAPTURE)
    proc = subprocess.run([sys.executable, "-m", "flagos_torchfl", "run", "--profile", profile, str(script),
                           device_type], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"GRAPH True {device_type.upper()}Graph 112.0" in proc.stdout, proc.stdout[-2000:]
    used = {name for name, _ in missing_uses.rows(profile)}
    assert not used & {"CUDAGraph", "graph", "make_graphed_callables", "graph_pool_handle",
                       "is_current_stream_capturing"}
