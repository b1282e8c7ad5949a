"""Start-up cost: activation imports only what it patches. On the cpu backend the modules that
import + activation add to ``sys.modules`` beyond ``import torch`` are the package's own and a
short named list, none of torch.distributed's optional parts (their patches wait for the
program's import). benchmarks/startup.py measures what this costs in time and memory."""
from __future__ import annotations

import json

from flagos_torchfl import compat
from flagos_torchfl.redirect.patches import REGISTRY
from tests.helpers import run_python

#: what activation on the cpu backend imports that ``import torch`` does not (besides the
#: package's own modules): torch's list of device constructors, which the factories patch reads
ADDED_ON_CPU = ["torch.utils._device"]

CODE = r'''
import json, sys
import torch
before = set(sys.modules)
import flagos_torchfl as ft
ft.auto_select_backend()
added = sorted(set(sys.modules) - before)
print(json.dumps({"added": added, "backend": ft.current_backend().backend}))
'''


def test_activation_on_cpu_adds_a_short_named_list_of_modules():
    proc = run_python(["-c", CODE], env={"FL_BACKEND": "cpu"})
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    assert found["backend"] == "cpu"
    foreign = [m for m in found["added"] if m != "flagos_torchfl" and not m.startswith("flagos_torchfl.")]
    assert foreign == ADDED_ON_CPU
    assert not [m for m in found["added"] if m.startswith("torch.distributed")]


LATER = r'''
import json, sys
import torch
import flagos_torchfl as ft
from flagos_torchfl import redirect
ft.auto_select_backend()
waiting = redirect.waiting_patches()
dynamo = "torch._dynamo.eval_frame" in sys.modules
import torch.distributed.fsdp
print(json.dumps({"waiting": waiting, "then": redirect.waiting_patches(), "last": redirect.active_patches()[-1],
                  "dynamo": [dynamo, "torch._dynamo.eval_frame" in sys.modules]}))
'''


def test_distributed_modules_imported_by_the_program_are_patched_there():
    """The other half of the bargain: the FSDP1 patch, not applied at activation, is applied
    when the program imports FSDP (every order: tests/redirect/test_patch_import_order.py)."""
    proc = run_python(["-c", LATER], env={"FL_BACKEND": "cpu"})
    assert proc.returncode == 0, proc.stderr
    # a torch without DeviceMesh (2.1) never imports torch.distributed.device_mesh: its patch waits;
    # so does the compile patch where `import torch` has not imported dynamo (2.1: FSDP imports it)
    found = json.loads(proc.stdout)
    mesh = [] if compat.has("device_mesh") else ["device_mesh"]
    dynamo_patches = [p.name for p in REGISTRY if (p.waits_for or "").startswith("torch._dynamo.")]
    compiling = [dynamo_patches if not imported else [] for imported in found.pop("dynamo")]
    # Inductor's cudagraph check waits for Inductor, which neither `import torch` nor FSDP imports
    inductor = [p.name for p in REGISTRY if (p.waits_for or "").startswith("torch._inductor.")]
    # patches of modules neither `import torch` nor FSDP imports: libraries, Triton's wrapper, FlexAttention
    libraries = ["accelerate_device", "deepspeed_accelerator", "triton_launches", "flex_attention"]
    assert found == {"waiting": [*inductor, *compiling[0], *mesh, "fsdp_device_id", *libraries],
                     "then": [*inductor, *compiling[1], *mesh, *libraries], "last": "fsdp_device_id"}


PROGRAM = r'''
import json, sys
import torch
print(json.dumps(sorted(sys.modules)))
'''


def test_run_adds_the_same_short_list(tmp_path):
    """``python -m flagos_torchfl run program.py`` against ``python program.py``: the launcher
    imports its own command and the package, no other command's modules, nothing more of torch."""
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    plain = run_python([str(script)], env={"FL_BACKEND": "cpu"})
    launched = run_python(["-m", "flagos_torchfl", "run", str(script)], env={"FL_BACKEND": "cpu"})
    assert plain.returncode == 0 and launched.returncode == 0, plain.stderr + launched.stderr
    added = set(json.loads(launched.stdout)) - set(json.loads(plain.stdout))
    # runpy runs ``python -m`` itself (a torch that imports it anyway hides it: 2.13 does)
    assert sorted(m for m in added if m.split(".")[0] not in ("flagos_torchfl", "runpy")) == ADDED_ON_CPU
    assert not {"flagos_torchfl.cli.detect", "flagos_torchfl.cli.ops", "flagos_torchfl.routing.plan"} & added
