"""On a chip whose plugin DeepSpeed knows (torch_npu, torch_mlu), DeepSpeed's own accelerator
stays under activation: the package's answers (``torch.cuda.is_available()`` is False for
DeepSpeed, a CUDA-kernel package) do not push it onto the CPU. Fake plugins, each in a fresh
interpreter (they claim PrivateUse1)."""
from __future__ import annotations

import textwrap

import pytest

from tests.helpers import ROOT, prepend_path, run_python
from tests.e2e.realclients import requires

pytestmark = requires("deepspeed")

#: what DeepSpeed reads from the device module at import (class annotations name its Event)
STREAMS = """
class Stream:
    def __init__(self, *args, **kwargs):
        pass


class Event(Stream):
    pass


{device}.Stream, {device}.Event = Stream, Event
"""


def _plugin(folder, backend: str):
    """A fake vendor plugin with streams and events: tests/fixtures/fake_npu, or the same for
    Cambricon (torch_mlu, device "mlu")."""
    source = (ROOT / "tests" / "fixtures" / "fake_npu" / "torch_npu.py").read_text()
    if backend == "cambricon":
        source = source.replace("Ascend910B", "MLU370-X8").replace("Ascend", "Cambricon").replace("npu", "mlu")
    device = "mlu" if backend == "cambricon" else "npu"
    folder.mkdir()
    (folder / f"torch_{device}.py").write_text(source + STREAMS.format(device=device))
    return folder


PROGRAM = textwrap.dedent("""
    import flagos_torchfl as ft
    ft.init_backend({backend!r})
    import deepspeed
    from deepspeed.accelerator import get_accelerator
    accelerator = get_accelerator()
    print(type(accelerator).__name__, accelerator.device_name(), accelerator.communication_backend_name())
""")


@pytest.mark.parametrize("backend,expected", [
    ("ascend", "NPU_Accelerator npu hccl"),
    ("cambricon", "MLU_Accelerator mlu cncl"),
])
@pytest.mark.full
def test_deepspeeds_own_accelerator_stays_on_known_vendor_chips(tmp_path, backend, expected):
    plugin = _plugin(tmp_path / "plugin", backend)
    env = prepend_path({"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}, "PYTHONPATH", plugin)
    proc = run_python(["-c", PROGRAM.format(backend=backend)], env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == expected
    assert "Setting accelerator to CPU" not in proc.stdout + proc.stderr
