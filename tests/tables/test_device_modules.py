"""The vendors' device modules as data (data/device_modules/): the ascend table is the real
torch-npu 2.13.0 wheel's ``torch_npu.npu.__all__``, the tool regenerates it byte for byte, and
``torch.cuda`` answers from it on the chip and on its sim profile; the verdict names the
``torch.cuda`` APIs a program used that the chip lacks."""
from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from flagos_torchfl.backends import registry
from flagos_torchfl.tables import device_modules
from tests.helpers import ROOT, prepend_path, run_python
from tests.wheels import read_member, wheel

TOOL = ROOT / "tools" / "device_modules.py"
DATA = ROOT / "src" / "flagos_torchfl" / "data" / "device_modules"


def literal_all(text):
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("no __all__")


def test_ascend_table_is_the_wheels_all_and_regenerates_identically(tmp_path):
    path = wheel("torch-npu", "2.13.0")
    names = literal_all(read_member(path, "torch_npu/npu/__init__.py"))
    table = device_modules.load("ascend")
    assert len(names) == 144 and table.names == set(names)
    assert table.source["file_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert table.origin == "torch-npu 2.13.0" and table.device_module == "torch.npu"
    out = tmp_path / "ascend.json"
    subprocess.run([sys.executable, str(TOOL), "ascend", str(path), "--out", str(out)], check=True,
                   capture_output=True, timeout=300)
    assert out.read_bytes() == (DATA / "ascend.json").read_bytes()


def test_every_table_keeps_and_counts_the_chips_own_names():
    for chip in device_modules.available():
        data = json.loads((DATA / f"{chip}.json").read_text())
        names = set(data["names"])
        assert data["counts"]["names"] == len(names) == len(data["names"])
        # names torch.cuda does not have are kept, not dropped
        assert set(data["not_in_torch_cuda"]) == names - set(torch.cuda.__all__)
        assert data["counts"]["not_in_torch_cuda"] == len(data["not_in_torch_cuda"]) > 0
        assert set(data["torch_cuda_missing"]) == set(torch.cuda.__all__) - names
        source = data["source"]
        assert len(source["sha256"]) == 64 and source["path"].endswith(".py")
        if source["kind"] == "repository":
            assert len(source["commit"]) == 40 and source["repository"] in (
                "Cambricon/torch_mlu", "MooreThreads/torch_musa")


@pytest.mark.parametrize("chip", ["ascend", "cambricon", "mthreads"])
def test_counterparts_name_what_the_chip_has_for_a_cuda_name(chip):
    backend = registry().get(chip)
    table = backend.device_module_table()
    assert table is not None and table.chip == chip
    assert backend.cuda_counterparts, chip
    for cuda_name, theirs in backend.cuda_counterparts.items():
        assert cuda_name in torch.cuda.__all__ and cuda_name not in table.names
        assert theirs in table.names, (chip, theirs)


def test_top_level_bindings_are_read_through_star_imports_from_a_repository(tmp_path):
    # the extraction used for torch_musa (no __all__), on a repository made here
    repo = tmp_path / "repo"
    (repo / "torch_musa" / "core").mkdir(parents=True)
    (repo / "torch_musa" / "__init__.py").write_text(textwrap.dedent("""
        import sys
        import torch
        from typing import Set
        from .core.device import set_device, current_device as current, _private
        from .core.memory import *
        from .core import amp
        try:
            from .core.graphs import *
        except ImportError:
            pass
        def ipc_collect(): pass
        class Stream: pass
        OutOfMemoryError = torch._C.OutOfMemoryError
        _hidden = 1
    """))
    (repo / "torch_musa" / "core" / "memory.py").write_text("__all__ = ['empty_cache', 'memory_allocated']\n")
    (repo / "torch_musa" / "core" / "graphs.py").write_text("import os\ndef graph(): pass\nclass MUSAGraph: pass\n")
    for args in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    out = tmp_path / "musa.json"
    subprocess.run([sys.executable, str(TOOL), "mthreads", str(repo), "--repository", "example/torch_musa",
                    "--ref", "HEAD", "--out", str(out)], check=True, capture_output=True, timeout=300)
    data = json.loads(out.read_text())
    assert data["names"] == sorted(["set_device", "current", "empty_cache", "memory_allocated", "amp", "graph",
                                    "MUSAGraph", "ipc_collect", "Stream", "OutOfMemoryError"])
    assert data["source"]["names_from"] == "top-level bindings" and len(data["source"]["commit"]) == 40


PROFILE_SCRIPT = r"""
import json, torch
import flagos_torchfl as ft
answers = {}
for name in torch.cuda.__all__:
    value = getattr(torch.cuda, name)
    if not (isinstance(value, type) and type(value).__name__ == "_UnservedMeta"):
        continue
    try:
        raise value._error()  # the error of a use (a call may first fail on its arguments)
    except ft.UnsupportedFeatureError as exc:
        answers[name] = str(exc)
print(json.dumps(answers))
"""


def test_the_facade_on_the_ascend_profile_answers_from_the_table(tmp_path):
    script = tmp_path / "names.py"
    script.write_text(PROFILE_SCRIPT)
    proc = run_python(["-m", "flagos_torchfl", "run", "--profile", "ascend", str(script)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    table = device_modules.load("ascend")
    counterparts = registry().get("ascend").cuda_counterparts
    lacking = {n for n, message in answers.items() if "has no" in message}
    has_elsewhere = {n for n, message in answers.items() if "ascend has torch.npu." in message}
    assert lacking | has_elsewhere == set(answers)
    assert lacking == {n for n in answers if n not in table.names and counterparts.get(n) not in table.names}
    assert "list_gpu_processes" in lacking
    assert not {"get_arch_list", "is_tf32_supported"} & set(answers)  # queries the facade answers itself
    assert "torch.cuda.list_gpu_processes is not available on ascend: torch.npu of torch-npu 2.13.0 has no " \
           "list_gpu_processes" in answers["list_gpu_processes"]
    assert "ascend has torch.npu.NPUPluggableAllocator" in answers["CUDAPluggableAllocator"]
    assert "CUDAGraph" not in answers  # the sim answers as torch.npu.NPUGraph
    assert "utilization" in has_elsewhere


def test_the_verdict_names_the_cuda_apis_the_chip_lacks(tmp_path):
    script = tmp_path / "arch.py"
    script.write_text(textwrap.dedent("""
        import torch
        assert hasattr(torch.cuda, "CUDAGraph") and hasattr(torch.cuda, "list_gpu_processes")  # reading is free
        with torch.cuda.nvtx.range("step"):
            x = torch.ones(4, device="cuda") * 2
        print("sum", x.sum().item())
        torch.cuda.list_gpu_processes()
    """))
    proc = run_python(["-m", "flagos_torchfl", "run", "--profile", "ascend", "--report", str(script)], timeout=300)
    assert proc.returncode == 1
    assert "sum 8.0" in proc.stdout
    assert "UnsupportedFeatureError: torch.cuda.list_gpu_processes is not available on ascend" in proc.stderr
    assert ("torch.cuda APIs the program used that ascend lacks (torch.npu of torch-npu 2.13.0 has no such "
            "name): torch.cuda.list_gpu_processes (1 use)") in proc.stderr
    as_json = run_python(["-m", "flagos_torchfl", "run", "--profile", "ascend", "--json", str(script)], timeout=300)
    verdict = json.loads(as_json.stderr[as_json.stderr.index("{"):])
    assert verdict["cuda_api_missing"]["names"] == [{"name": "torch.cuda.list_gpu_processes", "uses": 1}]


FAKE_NPU = '''
import types, torch
__version__ = "2.13.0"
torch.utils.rename_privateuse1_backend("npu")
npu = types.ModuleType("torch_npu.npu")
calls = []
npu.is_available = lambda: True
npu.device_count = lambda: 1
npu.current_device = lambda: 0
npu.set_device = lambda d: None
npu.synchronize = lambda d=None: None
npu.utilization = lambda device=None: 42
class _Props:
    name, total_memory = "Ascend910B", 32 << 30
npu.get_device_properties = lambda i=0: _Props()
npu.get_device_name = lambda i=0: _Props.name
class NPUGraph:
    pass
npu.NPUGraph = NPUGraph
class mstx:
    @staticmethod
    def range_push(message, stream=None, domain="default"):
        calls.append(("push", message)); return 0
    @staticmethod
    def range_pop(domain="default"):
        calls.append(("pop",)); return 0
npu.mstx = mstx
torch._register_device_module("npu", npu)
'''


def test_on_the_chip_counterparts_answer_and_lacking_names_raise_naming_it(tmp_path):
    (tmp_path / "torch_npu.py").write_text(FAKE_NPU)
    code = textwrap.dedent("""
        import torch, torch_npu
        import flagos_torchfl as ft
        ft.init_backend("ascend")
        print("graph", torch.cuda.CUDAGraph is torch.npu.NPUGraph)
        torch.cuda.nvtx.range_push("step"); torch.cuda.nvtx.range_pop()
        print("mstx", torch_npu.calls)
        print("utilization", torch.cuda.utilization())
        try:
            torch.cuda.list_gpu_processes()
        except ft.UnsupportedFeatureError as exc:
            print("error", exc)
    """)
    proc = run_python(["-c", code], env=prepend_path({}, "PYTHONPATH", tmp_path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "graph True" in proc.stdout
    assert "mstx [('push', 'step'), ('pop',)]" in proc.stdout
    assert "utilization 42" in proc.stdout
    assert "error torch.cuda.list_gpu_processes is not available on ascend: torch.npu of torch-npu 2.13.0 has no " \
           "list_gpu_processes (backend 'ascend', device type 'npu')" in proc.stdout
