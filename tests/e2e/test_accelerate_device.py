"""accelerate (1.16 on) picks its device with ``get_torch_accelerator_backend()``, which asks the
truthful ``torch.accelerator``: under activation it names ``cuda`` (the facade) wherever its own
answer would be no device (cpu backend) or one it does not know (the sim, a sim profile), whether
accelerate was imported before activation or after, with no accelerator hint at exit; deactivation
gives every accelerate module its own function back."""
import json

import pytest

from tests.helpers import run_python
from tests.e2e.realclients import requires

QUESTION = "get_torch_accelerator_backend"

SCRIPT = r"""
import json, sys, torch
first = sys.argv[1] == "accelerate-first"
if first:
    import accelerate.utils.imports
import flagos_torchfl as ft
ft.init_backend(backend="sim" if sys.argv[2] == "sim-ascend" else sys.argv[2])
import accelerate.utils.imports as imports
if not hasattr(imports, "{q}"):
    print(json.dumps({{"absent": True}})); raise SystemExit
import accelerate.state, accelerate.utils
from accelerate import Accelerator
device_type, module = imports.{q}()
accelerator = Accelerator()
model = accelerator.prepare(torch.nn.Linear(2, 2))
holders = [imports, accelerate.utils, accelerate.state]
record = {{"type": device_type, "facade": module is torch.cuda, "device": str(accelerator.device),
           "param": str(next(model.parameters()).device), "distributed": str(accelerator.distributed_type),
           "patched": [hasattr(getattr(m, "{q}"), "__wrapped__") for m in holders]}}
ft.deactivate()
originals = {{getattr(m, "{q}") for m in holders}}
record["restored"] = len(originals) == 1 and not hasattr(originals.pop(), "__wrapped__")
record["plain_after"] = list(map(str, imports.{q}()))
print(json.dumps(record))
""".format(q=QUESTION)


def answered(order: str, backend: str, tmp_path) -> dict:
    script = tmp_path / "ask_accelerate.py"
    script.write_text(SCRIPT)
    env = {"FL_SIM_PROFILE": "ascend"} if backend == "sim-ascend" else {}
    proc = run_python([str(script), order, backend], env=env, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "asked torch.accelerator" not in proc.stderr, proc.stderr[-2000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    if record.get("absent"):
        pytest.skip(f"this accelerate has no {QUESTION} (before 1.16): it asks torch.cuda itself")
    return record


@requires("accelerate")
@pytest.mark.parametrize("order", ["accelerate-first", "activate-first"])
@pytest.mark.parametrize("backend, param", [("cpu", "cpu"), ("sim", "sim:0"), ("sim-ascend", "npu:0")])
def test_accelerate_is_told_cuda_where_it_knows_no_device_of_the_backend(order, backend, param, tmp_path):
    got = answered(order, backend, tmp_path)
    assert got["type"] == "cuda" and got["facade"]
    assert got["device"] == "cuda" and got["param"] == param
    assert got["distributed"] == "DistributedType.NO"
    assert got["patched"] == [True, True, True]
    assert got["restored"]
    # deactivated: accelerate's own answer again (no accelerator on the cpu backend's host)
    assert got["plain_after"][0] != "cuda"
