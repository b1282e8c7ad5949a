"""What children inherit: the parent's current activation under ``run`` and in a program activated
in code (backend, devices, every setting, probe result), device masks translated only for the
chosen backend, and a clear decision in interpreters that have torch but not this package."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

import flagos_torchfl as ft
from flagos_torchfl.machine import visible
from tests.helpers import ROOT, clean_env, no_activation, prepend_path, run_python  # noqa: F401

pytestmark = pytest.mark.usefixtures("no_activation")

CHILD = textwrap.dedent("""
    import json, sys, torch, flagos_torchfl as ft
    s = ft.current_backend()
    print(json.dumps({"backend": s.backend, "devices": list(s.devices), "source": s.source,
                      "limit": str(s.settings.memory_virtual_limit),
                      "interval": s.settings.memory_pool_clear_interval,
                      "npu_imported": "torch_npu" in sys.modules}))
""")


def run_program(tmp_path, body, env=None):
    (tmp_path / "child.py").write_text(CHILD)
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, torch, flagos_torchfl as ft
        {body}
        print(subprocess.run([sys.executable, {str(tmp_path / 'child.py')!r}], capture_output=True,
                             text=True, check=True).stdout, end="")
    """))
    proc = run_python(["-m", "flagos_torchfl", "run", str(script)], env=env or {}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.needs_sim
def test_child_inherits_the_programs_own_init_backend(tmp_path):
    child = run_program(tmp_path, 'ft.init_backend("sim", memory_virtual_limit="64MiB", memory_pool_clear_interval=3)')
    assert child == {"backend": "sim", "devices": [0], "source": "inherited", "limit": "64 MiB",
                     "interval": 3, "npu_imported": False}


def test_child_sees_the_parents_gpu_ids_and_probes_nothing(tmp_path):
    marker = tmp_path / "imports"
    (tmp_path / "torch_npu.py").write_text(
        f"import os\nopen({str(marker)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
        "raise ImportError('no Ascend hardware')\n")
    env = prepend_path({"FL_CPU_DEVICES": "4"}, "PYTHONPATH", tmp_path)
    child = run_program(tmp_path, "ft.init_backend(gpu_ids=[2, 3])", env)
    assert (child["backend"], child["devices"], child["source"]) == ("cpu", [2, 3], "inherited")
    assert len(set(marker.read_text().split())) == 1  # only the launched process probed ascend


def test_child_setting_assignment_is_inherited(tmp_path):
    child = run_program(tmp_path, "ft.memory_pool_clear_interval = 9")
    assert (child["backend"], child["interval"]) == ("cpu", 9)


@pytest.mark.needs_sim
def test_child_with_its_own_device_environment_probes_again(tmp_path):
    script = tmp_path / "main.py"
    (tmp_path / "child.py").write_text(CHILD)
    script.write_text(textwrap.dedent(f"""
        import os, subprocess, sys, flagos_torchfl as ft
        ft.init_backend("sim", memory_pool_clear_interval=5)
        env = dict(os.environ, LOCAL_WORLD_SIZE="2")
        print(subprocess.run([sys.executable, {str(tmp_path / 'child.py')!r}], env=env,
                             capture_output=True, text=True, check=True).stdout, end="")
    """))
    proc = run_python(["-m", "flagos_torchfl", "run", str(script)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    child = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (child["backend"], child["devices"], child["source"], child["interval"]) == ("sim", [0, 1], "argument", 5)


IN_CODE = textwrap.dedent("""
    import json, multiprocessing as mp, subprocess, sys
    import torch
    import flagos_torchfl as ft

    def state(tag):
        s = ft.current_backend()
        device = str(torch.ones(1, device="cuda").device) if s is not None else None
        return [tag, s and s.backend, s and s.source, device]

    def work(queue, tag):
        queue.put(state(tag))

    def rank(i, queue):
        queue.put(state(f"torch.multiprocessing.spawn rank {i}"))

    def children(tag):
        found = []
        for method in ("spawn", "forkserver"):
            ctx = mp.get_context(method)
            queue = ctx.Queue()
            p = ctx.Process(target=work, args=(queue, f"{tag} {method}"))
            p.start()
            found.append(queue.get(timeout=120))
            p.join()
        return found

    if __name__ == "__main__":
        ft.init_backend("sim", memory_pool_clear_interval=3)
        found = children("activated")
        queue = mp.get_context("spawn").SimpleQueue()
        torch.multiprocessing.spawn(rank, args=(queue,), nprocs=2)
        found += sorted(queue.get() for _ in range(2))
        # a child whose first import is the package (which imports torch itself)
        code = "import flagos_torchfl as ft; s = ft.current_backend(); print(s.backend, s.source, s.settings.memory_pool_clear_interval)"
        found.append(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split())
        ft.deactivate()
        found += children("deactivated")
        print(json.dumps(found))
""")


@pytest.mark.needs_sim
def test_children_of_a_program_activated_in_code_activate_as_it(tmp_path):
    """Without ``run``: torch's ``torch.backends`` entry point activates each Python child as
    its parent (spawn, forkserver, ``torch.multiprocessing.spawn``, ``subprocess``), also where
    the child's first import is the package; after ``ft.deactivate()`` new interpreters run
    plainly."""
    script = tmp_path / "main.py"
    script.write_text(IN_CODE)
    proc = run_python([str(script)], timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == [
        ["activated spawn", "sim", "inherited", "sim:0"],
        ["activated forkserver", "sim", "inherited", "sim:0"],
        ["torch.multiprocessing.spawn rank 0", "sim", "inherited", "sim:0"],
        ["torch.multiprocessing.spawn rank 1", "sim", "inherited", "sim:0"],
        ["sim", "inherited", "3"],
        ["deactivated spawn", None, None, None],
        # the fork server started while the parent was activated, and its children are forks
        ["deactivated forkserver", "sim", "inherited", "sim:0"],
    ]


def test_deactivate_restores_the_published_activation(monkeypatch):
    monkeypatch.setenv("FL_ACTIVATE", "1")
    monkeypatch.setenv("FL_PARENT_ACTIVATION", "from-the-grandparent")
    ft.init_backend("cpu", memory_pool_clear_interval=2)
    assert json.loads(os.environ["FL_PARENT_ACTIVATION"])["settings"]["memory_pool_clear_interval"] == 2
    ft.memory_pool_clear_interval = 4
    assert json.loads(os.environ["FL_PARENT_ACTIVATION"])["settings"]["memory_pool_clear_interval"] == 4
    ft.deactivate()
    assert os.environ["FL_PARENT_ACTIVATION"] == "from-the-grandparent"


def test_no_plugin_no_translation_and_nothing_left_after_deactivate(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    ft.auto_select_backend()
    ft.deactivate()
    assert sorted(k for k in os.environ if "VISIBLE" in k) == ["CUDA_VISIBLE_DEVICES"]


def test_translation_rules():
    environ = {"CUDA_VISIBLE_DEVICES": "0,1"}
    undo = visible.translate("ASCEND_RT_VISIBLE_DEVICES", environ)
    assert environ["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"
    child = dict(environ, CUDA_VISIBLE_DEVICES="1")  # a worker's own mask wins over the parent's copy
    child_undo = visible.translate("ASCEND_RT_VISIBLE_DEVICES", child)
    assert child["ASCEND_RT_VISIBLE_DEVICES"] == "1"
    child_undo()
    assert child == dict(environ, CUDA_VISIBLE_DEVICES="1")
    undo()
    assert environ == {"CUDA_VISIBLE_DEVICES": "0,1"}
    users = {"CUDA_VISIBLE_DEVICES": "0,1", "ASCEND_RT_VISIBLE_DEVICES": "3"}  # the user's own mask
    assert visible.translate("ASCEND_RT_VISIBLE_DEVICES", users) is None
    assert users["ASCEND_RT_VISIBLE_DEVICES"] == "3"


def test_activated_vendor_backend_translates_and_undoes():
    fixture = ROOT / "tests" / "fixtures" / "fake_npu"
    code = textwrap.dedent("""
        import os, flagos_torchfl as ft
        ft.init_backend("ascend")
        print(os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), os.environ.get("FL_VISIBLE_DEVICES_TRANSLATED"))
        ft.deactivate()
        print(os.environ.get("ASCEND_RT_VISIBLE_DEVICES"), os.environ.get("FL_VISIBLE_DEVICES_TRANSLATED"))
    """)
    env = prepend_path({"CUDA_VISIBLE_DEVICES": "0,1"}, "PYTHONPATH", fixture)
    proc = run_python(["-c", code], env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["0,1 ASCEND_RT_VISIBLE_DEVICES=0,1", "None None"]


@pytest.fixture(scope="module")
def foreign_python(tmp_path_factory):
    """A venv interpreter that reaches torch (its site-packages on PYTHONPATH) but not
    flagos_torchfl (installed by a .pth file, which PYTHONPATH entries do not run)."""
    import torch

    folder = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    return folder / "bin" / "python", os.path.dirname(os.path.dirname(torch.__file__))


@pytest.mark.parametrize("fl_backend", [None, "cpu"])
def test_foreign_interpreter_under_run(tmp_path, foreign_python, fl_backend):
    python, site = foreign_python
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(f"""
        import os, subprocess, sys
        code = "import torch; print('foreign ran', torch.ones(1).device)"
        # the tool's environment: the launcher's variables, without this package's sources
        paths = [p for p in os.environ["PYTHONPATH"].split(os.pathsep) if p != {str(ROOT / "src")!r}]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths))
        proc = subprocess.run([{str(python)!r}, "-c", code], capture_output=True, text=True, env=env)
        print(proc.returncode, proc.stdout.strip(), "|", proc.stderr.strip())
    """))
    args = ["-m", "flagos_torchfl", "run", *(["--backend", fl_backend] if fl_backend else []), str(script)]
    proc = subprocess.run([sys.executable, *args], env=clean_env({"PYTHONPATH": os.pathsep.join(
        [str(ROOT / "src"), site])}), capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip().splitlines()[-1]
    if fl_backend is None:
        assert line.startswith("0 foreign ran cpu | flagos_torchfl: warning: not installed in this Python interpreter")
        assert line.count("flagos_torchfl:") == 1
    else:
        assert line.startswith("1  | flagos_torchfl: cannot activate backend cpu: ModuleNotFoundError: "
                               "flagos_torchfl is not installed in this Python interpreter")
        assert "unset FL_BACKEND" in line
