"""Child processes of a launched program activate without the program changing: ``subprocess``
of python, ``multiprocessing`` spawn/forkserver, DataLoader workers, ``torch.multiprocessing.spawn``
and torchrun workers; children that never import torch pay nothing; failures are loud."""

import pytest

from tests.helpers import ROOT

from tests.cli.launching import REPORT_FUNCTION, launch, state, states, write

FAMILY = REPORT_FUNCTION + '''
import multiprocessing, os, subprocess, sys

REPORT_FUNCTION = {report!r}


def spawned(tag):
    import torch
    fl_state(tag)


def rank_worker(rank):
    fl_state(f"torch.multiprocessing.spawn rank {{rank}}")


class Dataset:
    def __len__(self):
        return 4

    def __getitem__(self, index):
        sel = sys.modules["flagos_torchfl"].current_backend()
        return {{"backend": sel and sel.backend, "pid": os.getpid()}}


if __name__ == "__main__":
    fl_state("main")
    subprocess.run([sys.executable, "-c", "import torch\\n" + REPORT_FUNCTION +
                    "fl_state('subprocess', loader=type(torch.__spec__.loader).__name__, "
                    "cuda_tensor=str(torch.zeros(2, device='cuda').device))"], check=True)
    subprocess.run([sys.executable, "-c", REPORT_FUNCTION + """
import sys
fl_state('no torch', imported=[m for m in ('torch', 'flagos_torchfl') if m in sys.modules],
         watcher=[type(f).__name__ for f in sys.meta_path][0])"""], check=True)
    for method in ("spawn", "forkserver"):
        process = multiprocessing.get_context(method).Process(target=spawned, args=(method,))
        process.start()
        process.join()
        assert process.exitcode == 0, (method, process.exitcode)
    import torch
    from torch.utils.data import DataLoader
    loader = DataLoader(Dataset(), batch_size=None, num_workers=2, multiprocessing_context="spawn")
    fl_state("dataloader", items=list(loader))
    torch.multiprocessing.spawn(rank_worker, nprocs=2)
'''.format(report=REPORT_FUNCTION)


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """One launched program that starts every kind of child; returns its CompletedProcess."""
    folder = tmp_path_factory.mktemp("family")
    write(folder, "family.py", FAMILY)
    proc = launch("--backend", "cpu", "family.py", cwd=folder)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def test_subprocess_python_child_is_activated_after_torch_finished_importing(family):
    main, child = state(family.stdout, "main"), state(family.stdout, "subprocess")
    assert child["pid"] != main["pid"]
    assert (child["backend"], child["source"]) == ("cpu", "inherited")  # the parent's activation, not probed again
    assert child["loader"] == "SourceFileLoader"  # the watcher leaves torch's module as it was


def test_child_using_cuda_names_runs_on_the_selected_backend(family):
    assert state(family.stdout, "subprocess")["cuda_tensor"] == "cpu"


def test_child_that_never_imports_torch_imports_neither_torch_nor_flagos_torchfl(family):
    child = state(family.stdout, "no torch")
    assert child["watcher"] == "_ImportWatcher"  # the bootstrap did run in it
    assert child["imported"] == [] and child["backend"] is None


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_multiprocessing_children_are_activated(family, method):
    assert state(family.stdout, method)["backend"] == "cpu"


def test_dataloader_spawn_workers_are_activated(family):
    main = state(family.stdout, "main")
    items = state(family.stdout, "dataloader")["items"]
    assert [item["backend"] for item in items] == ["cpu"] * 4
    assert main["pid"] not in {item["pid"] for item in items}


def test_torch_multiprocessing_spawn_workers_are_activated(family):
    ranks = [s for s in states(family.stdout) if s["tag"].startswith("torch.multiprocessing.spawn")]
    assert sorted(s["tag"][-6:] for s in ranks) == ["rank 0", "rank 1"]
    assert {s["backend"] for s in ranks} == {"cpu"}


def test_child_that_cannot_activate_prints_why_and_exits_nonzero(tmp_path):
    write(tmp_path, "parent.py", '''
        import os, subprocess, sys
        os.environ["FL_BACKEND"] = "ascend"
        del os.environ["FL_BACKEND_FROM_LAUNCHER"]
        guarded = "try:\\n    import torch\\nexcept BaseException:\\n    pass\\nprint('ran on the wrong device')"
        sys.exit(subprocess.run([sys.executable, "-c", guarded]).returncode)
    ''')
    proc = launch("--backend", "cpu", "parent.py", cwd=tmp_path)
    assert proc.returncode == 1
    assert "ran on the wrong device" not in proc.stdout
    assert "flagos_torchfl: cannot activate backend ascend: BackendUnavailableError:" in proc.stderr
    assert "torch_npu is not installed" in proc.stderr


def test_child_activates_a_vendor_plugin_backend_promptly(tmp_path):
    # The child's activation runs while torch's own import is finishing; the probe imports the
    # vendor plugin (which imports torch) in another thread, which must not wait for it.
    write(tmp_path, "parent.py", """
        import subprocess, sys
        subprocess.run([sys.executable, "child.py"], check=True)
    """)
    write(tmp_path, "child.py", REPORT_FUNCTION + '''
import time
start = time.monotonic()
import torch
fl_state("child", seconds=time.monotonic() - start, devices=torch.cuda.device_count())
''')
    plugin = ROOT / "tests" / "fixtures" / "fake_npu"
    proc = launch("--backend", "ascend", "parent.py", cwd=tmp_path,
                  env={"PYTHONPATH": str(plugin), "FL_PROBE_TIMEOUT": "20"})
    child = state(proc.stdout, "child")
    assert child["backend"] == "ascend", proc.stderr
    assert child["seconds"] < 20 and child["devices"] == 1


def test_users_own_sitecustomize_still_runs_in_children(tmp_path):
    write(tmp_path, "user_site/sitecustomize.py", "import os\nos.environ['USER_SITECUSTOMIZE'] = __file__\n")
    write(tmp_path, "parent.py", '''
        import subprocess, sys
        subprocess.run([sys.executable, "child.py"], check=True)
    ''')
    write(tmp_path, "child.py", REPORT_FUNCTION + '''
import os, sitecustomize, torch
fl_state("child", user=os.environ.get("USER_SITECUSTOMIZE"), module=sitecustomize.__file__)
''')
    proc = launch("parent.py", cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "user_site")})
    assert proc.returncode == 0, proc.stderr
    child = state(proc.stdout, "child")
    user_file = str(tmp_path / "user_site" / "sitecustomize.py")
    assert child["user"] == user_file and child["module"] == user_file
    assert child["backend"] == "cpu"


def test_torchrun_workers_are_activated(tmp_path):
    write(tmp_path, "ddp.py", REPORT_FUNCTION + '''
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(total)
fl_state(f"rank {dist.get_rank()}", total=int(total.item()))
dist.destroy_process_group()
''')
    proc = launch("--backend", "cpu", "--", "torchrun", "--standalone", "--nproc_per_node=2", "ddp.py",
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [state(proc.stdout, f"rank {r}") for r in (0, 1)]
    assert [(r["backend"], r["source"], r["total"]) for r in ranks] == [("cpu", "launcher", 3)] * 2
