"""Activation never makes an import fail that works without it: each name imports under
``python -m flagos_torchfl run`` exactly when it imports plainly (each in a fresh interpreter)."""
import pytest

from tests.e2e.realclients import client, records, run_launched, run_plain, skip_unless_installed

TARGETS = [
    ("transformers", "Trainer", "transformers"),
    ("accelerate", "Accelerator", "accelerate"),
    ("lightning", "Trainer", "lightning"),
    ("peft", "get_peft_model", "peft"),
    ("diffusers", "StableDiffusionPipeline", "diffusers"),
    ("bitsandbytes", None, "bitsandbytes"),
    ("torchmetrics", "Accuracy", "torchmetrics"),
    ("deepspeed", "initialize", "deepspeed"),
    ("torch.testing._internal.common_methods_invocations", "op_db", "expecttest"),
]


@pytest.mark.parametrize("module,attribute,package", TARGETS, ids=[t[0].split(".")[-1] for t in TARGETS])
def test_imports_under_activation_iff_plainly(module, attribute, package):
    skip_unless_installed(package)
    args = [client("import_probe.py"), module] + ([attribute] if attribute else [])
    plain = records(run_plain(args), "import")[0]
    got = records(run_launched(args), "import")[0]
    assert got["ok"] == plain["ok"], f"plain: {plain}\nactivated: {got}"
