"""``python -m flagos_torchfl surface``: the verdicts of a backend or profile, JSON, and the exit
code that fails on an entry the table does not classify."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from flagos_torchfl.cli import main


def test_it_lists_every_entry_with_its_verdict(capsys):
    assert main(["surface", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line.split()[1:3] for line in out.splitlines()[1:] if line.strip() and "entries on" not in line}
    assert lines["torch.cuda.set_device"][:1] == ["answered"]
    assert lines["torch.Tensor.to"] == ["redirected", "tensor_to"]
    assert lines["torch.cuda.CUDAGraph"][0] == "answered"
    assert f"entries on cpu (torch {torch.__version__})" in out


def test_json_holds_the_counts_and_every_entry(capsys):
    assert main(["surface", "--profile", "ascend", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backend"] == "ascend" and data["unclassified"] == []
    assert sum(data["counts"].values()) == len(data["entries"])
    allocator = next(e for e in data["entries"] if e["name"] == "torch.cuda.CUDAPluggableAllocator")
    assert allocator["verdict"] == "refused" and allocator["counterpart"] == "torch.npu.NPUPluggableAllocator"


def test_unclassified_entries_fail_the_command_by_name(capsys, monkeypatch):
    def peer_bandwidth(device=None):
        return 0

    peer_bandwidth.__module__ = "torch.cuda"
    assert main(["surface", "--backend", "sim", "--unclassified"]) == 0
    assert "are classified" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "peer_bandwidth", peer_bandwidth, raising=False)
    assert main(["surface", "--backend", "sim", "--unclassified"]) == 1
    out = capsys.readouterr().out
    assert "1 entries" in out and "torch.cuda.peer_bandwidth (function, device, whole)" in out


def test_a_backend_or_a_profile_is_required(capsys):
    assert main(["surface"]) == 2
    assert "give --backend NAME or --profile CHIP" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["surface", "--backend", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


@pytest.mark.full
def test_the_command_runs_as_a_program():
    proc = subprocess.run([sys.executable, "-m", "flagos_torchfl", "surface", "--profile", "ascend"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "torch.npu.NPUGraph" in proc.stdout and "entries on ascend" in proc.stdout
