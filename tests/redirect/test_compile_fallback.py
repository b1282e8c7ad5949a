"""``torch.compile`` where the chip has no Inductor code generator: the fault (a device type that
Inductor has no backend for) is injected by removing the sim's registration from Inductor's
registry, in a fresh interpreter. The graph then compiles with ``aot_eager``, with one warning
naming the device type and the fallback, and gives eager's results; the sim's own Inductor
backend is used, without a warning, before the fault."""
import json

import pytest

from tests.helpers import run_python

SCRIPT = r'''
import json, warnings, torch, torch.nn as nn
import flagos_torchfl as ft
ft.init_backend("sim")
torch.manual_seed(0)
m = nn.Sequential(nn.Linear(8, 8), nn.GELU()).cuda()
x = torch.randn(4, 8, device="cuda")
record = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    native = torch.compile(m)(x)
    from torch._inductor.codegen import common
    record["sim_has_inductor"] = common.get_scheduling_for_device("sim") is not None
    del common.device_codegens["sim"]
    torch._dynamo.reset()
    compiled = torch.compile(m)
    out = compiled(x)
    out.sum().backward()
    compiled(x + 1)
record["warnings"] = [str(w.message) for w in caught if "Inductor has no code generator" in str(w.message)]
record["equal"] = torch.equal(out.cpu(), m(x).cpu()) and torch.allclose(native.cpu(), out.cpu(), rtol=1e-6)
record["grad"] = m[0].weight.grad is not None and m[0].weight.grad.device.type == "sim"
patched = torch._TorchCompileInductorWrapper.__call__
ft.deactivate()
record["restored"] = torch._TorchCompileInductorWrapper.__call__ is not patched
print(json.dumps(record))
'''


@pytest.mark.needs_sim
def test_a_chip_without_inductor_compiles_with_aot_eager_and_one_warning():
    proc = run_python(["-c", SCRIPT], timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert record["sim_has_inductor"]
    assert len(record["warnings"]) == 1, record["warnings"]
    assert "'sim'" in record["warnings"][0] and "'aot_eager'" in record["warnings"][0]
    assert record["equal"] and record["grad"] and record["restored"]
