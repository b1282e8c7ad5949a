"""PyTorch's official FSDP2 example's calls (the device from ``torch.accelerator``, set by
``DeviceMesh`` from ``LOCAL_RANK``; meta-device model, ``fully_shard`` in bfloat16 mixed precision,
``to_empty``, ``reset_parameters``, DCP save and resume), with 2 processes on sim through the
launcher.

``reset_parameters()`` on sharded parameters runs DTensor's random ops, which read and move the
device generator's Philox-style (seed, offset) state: each rank's shard is drawn at its own offset.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, clean_env, free_port, run_tree

CLIENT = Path(__file__).parent / "clients" / "fsdp2_meta_init.py"


@pytest.mark.needs_sim
@pytest.mark.torch_feature("accelerator")
@pytest.mark.torch_feature("fsdp2")
@pytest.mark.torch_feature("dcp_state_dict")
def test_fsdp2_meta_init_trains_on_sim_and_resumes_from_its_checkpoint(tmp_path):
    env = clean_env({"FL_BACKEND": "sim"})
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "flagos_torchfl", "run", "--", sys.executable, "-m",
            "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}", str(CLIENT),
            str(tmp_path / "ckpt"), str(tmp_path)]
    proc = run_tree(argv, env, 400)
    files = sorted(tmp_path.glob("fsdp2_meta_init.rank*.json"))
    assert proc.returncode == 0 and len(files) == 2, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    ranks = [json.loads(f.read_text()) for f in files]
    for rank, record in enumerate(ranks):
        assert record["device"] == f"sim:{rank}"
        assert record["current_device"] == rank  # DeviceMesh set it: the runtime started lazily
        assert record["unsharded_dtype"] == ["torch.bfloat16"]
        assert record["rng_state_bytes"] == 16  # seed + offset, as an accelerator's generator
        assert record["resumed_losses"] == record["straight_losses"]
        assert record["final_params"] == record["straight_params"]
        assert all(0 < loss < 10 for loss in record["straight_losses"])
    # every rank sees the same full parameters, and the shards are drawn at different offsets
    assert ranks[0]["init_params"] == ranks[1]["init_params"]
    assert ranks[0]["first_shard"] != ranks[1]["first_shard"]
    first = ranks[0]["init_params"][0]
    assert first[:len(first) // 2] == ranks[0]["first_shard"] and first[len(first) // 2:] == ranks[1]["first_shard"]
