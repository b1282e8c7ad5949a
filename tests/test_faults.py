"""Fault injection: hung, garbage and failing vendor tools, plugins that hang or raise on import,
and setting assignments while another thread trains. No verdict depends on the machine's speed: a
hung tool hangs for 300 s, and what a test waits for is an event (a start stamp, a training step)."""
import os
import stat
import threading
import time

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl.machine import bounded_calls as probe_tools
from tests.helpers import no_activation, prepend_path, run_python  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_activation")

TOOLS = ("nvidia-smi", "rocm-smi", "npu-smi", "cnmon", "mthreads-gmi", "xpu-smi")


def write_tool(folder, name, body):
    path = folder / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


@pytest.fixture
def hung_tools(tmp_path):
    """Every vendor query tool on PATH, each hanging after forking a child that hangs too (its
    start time written to ``<tool>.started``, its child's pid to ``<tool>.pid``). They hang for
    300 s: a call that returns within 60 s was not waiting for them, however slow the machine."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in TOOLS:
        write_tool(folder, tool, f"date +%s.%N > {tmp_path}/{tool}.started\n"
                               f"sleep 300 & echo $! > {tmp_path}/{tool}.pid\nsleep 300")
    return folder


def alive(pid: int, wait: float = 2.0) -> bool:
    """Whether ``pid`` still runs ``wait`` seconds from now (a zombie counts as ended)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                running = f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            running = False
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.05)


def test_hung_tool_is_killed_with_its_children(hung_tools, tmp_path):
    start = time.monotonic()
    out, problem = probe_tools.run_tool([str(hung_tools / "npu-smi"), "info"], timeout=1.0)
    assert time.monotonic() - start < 60  # the tool hangs for 300 s
    assert out is None and problem == f"{hung_tools / 'npu-smi'} did not answer within 1 s"
    assert not alive(int((tmp_path / "npu-smi.pid").read_text()))


def test_endless_garbage_is_cut_off(tmp_path):
    tool = write_tool(tmp_path, "garbage-smi", "yes '\\377\\001 garbage'")
    out, problem = probe_tools.run_tool([str(tool)], timeout=300.0)  # cut by its size, not the clock
    assert out is None and problem == f"{tool} printed more than {probe_tools.MAX_TOOL_OUTPUT} bytes"


def test_activation_with_every_tool_hung_runs_no_tool(hung_tools, tmp_path):
    env = prepend_path({"FL_PROBE_TIMEOUT": "3"}, "PATH", hung_tools)
    code = "import flagos_torchfl as ft; print(ft.auto_select_backend().backend)"
    proc = run_python(["-c", code], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu"]
    assert not list(tmp_path.glob("*.started"))  # no tool was run


def test_detect_queries_every_tool_at_once(hung_tools, tmp_path, monkeypatch):
    """nvidia-smi and rocm-smi on PATH count as drivers present (both are queried, together);
    the other tools wait for their plugin, which is not installed."""
    from flagos_torchfl.backends import registry

    monkeypatch.setenv("PATH", f"{hung_tools}{os.pathsep}{os.environ['PATH']}")
    drivers = probe_tools.query_drivers(registry().backends(), 2.0)
    # one timeout in all, not one per tool: the second tool started before the first one's ran out
    started = sorted(float(p.read_text()) for p in tmp_path.glob("*.started"))
    assert len(started) == 2 and started[1] - started[0] < 2.0
    assert drivers["cuda"] == (None, "nvidia-smi did not answer within 2 s")
    assert drivers["rocm"] == (None, "rocm-smi did not answer within 2 s")
    assert drivers["ascend"] == (None, None)
    assert sorted(p.stem for p in tmp_path.glob("*.pid")) == ["nvidia-smi", "rocm-smi"]
    for pidfile in tmp_path.glob("*.pid"):
        assert not alive(int(pidfile.read_text()))


@pytest.mark.parametrize("plugin, expected", [
    ("raise ImportError('libascendcl.so: cannot open shared object file')",
     "importing torch_npu failed: ImportError: libascendcl.so"),
    ("import time\ntime.sleep(60)", "importing torch_npu did not finish within 1 s"),
])
def test_broken_plugin_under_auto_selection_falls_back_to_cpu(tmp_path, plugin, expected):
    (tmp_path / "torch_npu.py").write_text(plugin + "\n")
    env = prepend_path({"FL_PROBE_TIMEOUT": "1"}, "PYTHONPATH", tmp_path)
    code = "import flagos_torchfl as ft; print(ft.auto_select_backend().reason)"
    proc = run_python(["-c", code], env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "highest-priority available backend; not available: cuda, rocm, ascend" in proc.stdout
    proc = run_python(["-c", "import flagos_torchfl as ft; ft.init_backend('ascend')"], env=env, timeout=300)
    assert proc.returncode == 1 and expected in proc.stderr


def test_setting_assignments_never_unpatch_torch_for_other_threads():
    ft.init_backend("cpu")
    model = torch.nn.Linear(4, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    errors, steps, stop = [], [0], threading.Event()

    def train():
        while not stop.is_set():
            try:
                assert torch.cuda.is_available()
                x = torch.zeros(2, 4, device="cuda")
                loss = model(x.cuda()).sum()
                loss.backward()
                optimizer.step()
                steps[0] += 1
            except Exception as exc:  # collected: the test reports them all
                errors.append(repr(exc))

    worker = threading.Thread(target=train)
    worker.start()
    try:
        i = 0
        # assignments go on until the worker has trained, however slowly (or failed)
        while (i < 200 or steps[0] < 3) and not errors and i < 10_000_000:
            ft.memory_pool_clear_interval = 1 + i % 7
            ft.enable_mixed_precision = bool(i % 2)
            i += 1
    finally:
        stop.set()
        worker.join(30)
    assert errors == [] and steps[0] > 0
    assert ft.current_backend().settings.memory_pool_clear_interval == 1 + (i - 1) % 7
    ft.deactivate()
    assert not torch.cuda.is_available()


def test_setting_assignment_leaves_patches_in_place():
    ft.init_backend("cpu")
    patched = torch.cuda.is_available
    ft.memory_pool_clear_interval = 50
    assert torch.cuda.is_available is patched
    assert ft.current_backend().settings.memory_pool_clear_interval == 50

