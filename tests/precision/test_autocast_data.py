"""CUDA's autocast lists (the data file) against the installed PyTorch: every listed operator
has an AutocastCUDA kernel and every operator with one is listed; the generator reproduces the
file from the installed wheel's header."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from flagos_torchfl.precision import cuda_lists, listed_ops
from tests.helpers import ROOT

#: the torch the data file was generated from; its lists are compared with that torch only
GENERATED_FROM = cuda_lists()["provenance"]["torch_version"]
same_torch_as_the_file = pytest.mark.skipif(
    torch.__version__.split("+")[0] != GENERATED_FROM,
    reason=f"data/autocast_cuda.json was generated from torch {GENERATED_FROM}; this is torch {torch.__version__}")


def _cuda_autocast_ops() -> set:
    return {n for n in torch._C._dispatch_get_all_op_names()
            if torch._C._dispatch_has_kernel_for_dispatch_key(n, "AutocastCUDA")}


@same_torch_as_the_file
def test_every_listed_operator_has_a_cuda_autocast_kernel():
    missing = sorted(op for op in listed_ops() if
                     not torch._C._dispatch_has_kernel_for_dispatch_key(op, "AutocastCUDA"))
    assert missing == []


@same_torch_as_the_file
def test_every_cuda_autocast_kernel_is_listed():
    assert sorted(_cuda_autocast_ops() - set(listed_ops())) == []


@same_torch_as_the_file
def test_provenance_names_the_installed_torch():
    prov = cuda_lists()["provenance"]
    assert prov["torch_version"] == torch.__version__.split("+")[0]
    assert prov["commit"] == torch.version.git_version
    assert "aten/src/ATen/autocast_mode.cpp" in prov["files"]


def test_policies_are_disjoint_and_known():
    policies = cuda_lists()["policies"]
    assert set(policies) == {"lower_precision_fp", "fp32", "fp32_set_opt_dtype",
                             "fp32_append_dtype", "promote", "banned"}
    total = sum(len(v) for v in policies.values())
    assert total == len(listed_ops())  # no operator under two policies
    for op, target in policies["fp32_append_dtype"].items():
        assert torch._C._dispatch_has_kernel_for_dispatch_key(target, "CPU") or \
            torch._C._dispatch_has_kernel_for_dispatch_key(target, "CompositeImplicitAutograd") or \
            torch._C._dispatch_has_kernel_for_dispatch_key(target, "CompositeExplicitAutograd")


@pytest.mark.full
@same_torch_as_the_file
def test_generator_reproduces_the_data_file():
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "autocast_lists.py")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == cuda_lists()
