"""The questions CUDA code asks before it picks a path, on the plain sim and on every profile, each
in a fresh interpreter (a profile claims PrivateUse1 for its process): the answers of the table in
docs/design.md ("What CUDA code asks before it picks a path"), and NVIDIA's variables reaching the
chip's own. The ascend profiles are also checked in-process (test_profile_ascend*.py)."""
from __future__ import annotations

import json

import pytest

from tests.helpers import run_python

pytestmark = pytest.mark.needs_sim

QUERIES = r'''
import json, os, torch, torch.distributed as dist
import flagos_torchfl as ft
ft.init_backend("sim")
c = torch.cuda
props = c.get_device_properties(0)
print(json.dumps({
    "name": c.get_device_name(0), "nccl": [dist.is_nccl_available(), dist.is_backend_available("nccl")],
    "bf16": c.is_bf16_supported(), "capability": list(c.get_device_capability()),
    "props": [props.major, props.minor], "tf32": c.is_tf32_supported(), "arch": c.get_arch_list(),
    "nccl_version": list(c.nccl.version()),
    "env": {k: v for k, v in os.environ.items() if k.startswith(("HCCL_", "TORCH_HCCL_", "TORCH_CNCL_",
            "MCCL_", "TORCH_MCCL_", "MUSA_LAUNCH", "ASCEND_LAUNCH"))},
}))
ft.deactivate()
assert not dist.is_nccl_available() or dist.is_nccl_available is dist.distributed_c10d.is_nccl_available
print(json.dumps(sorted(k for k in os.environ if k.startswith(("HCCL_", "MCCL_", "TORCH_CNCL_", "MUSA_LAUNCH")))))
'''
NVIDIA = {"NCCL_SOCKET_IFNAME": "lo", "CUDA_LAUNCH_BLOCKING": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1"}
#: profile -> (device name, bfloat16, capability, TF32, the chip's variables set from NVIDIA's)
EXPECTED = {
    "": ("flagos sim device", True, [8, 0], False, {}),
    "ascend": ("Ascend910B1 (flagos sim)", True, [8, 0], False,
               {"HCCL_SOCKET_IFNAME": "lo", "ASCEND_LAUNCH_BLOCKING": "1"}),
    "ascend:910a": ("Ascend910A (flagos sim)", False, [7, 0], False,
                    {"HCCL_SOCKET_IFNAME": "lo", "ASCEND_LAUNCH_BLOCKING": "1"}),
    "cambricon": ("MLU370-X8 (flagos sim)", False, [7, 0], False, {"TORCH_CNCL_AVOID_RECORD_STREAMS": "1"}),
    "mthreads": ("MTT S4000 (flagos sim)", True, [8, 0], True,
                 {"MCCL_SOCKET_IFNAME": "lo", "MUSA_LAUNCH_BLOCKING": "1", "TORCH_MCCL_AVOID_RECORD_STREAMS": "1"}),
}


@pytest.mark.parametrize("profile", list(EXPECTED), ids=[p or "sim" for p in EXPECTED])
def test_each_chip_answers_the_queries_as_its_model(profile):
    env = {"FL_BACKEND": "sim", **NVIDIA, **({"FL_SIM_PROFILE": profile} if profile else {})}
    proc = run_python(["-c", QUERIES], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found, left = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
    name, bf16, capability, tf32, variables = EXPECTED[profile]
    assert found["name"] == name and found["nccl"] == [True, True]
    assert (found["bf16"], found["capability"], found["props"]) == (bf16, capability, capability)
    assert capability[0] >= 8 if bf16 else capability[0] < 8  # major >= 8 exactly with bfloat16
    assert found["tf32"] is tf32 and found["arch"] == [] and found["nccl_version"] == [0, 0, 0]
    assert found["env"] == variables
    assert left == []  # ft.deactivate() removed what activation set
