"""The sim at exit: the autograd engine's device threads finish before the interpreter finalizes
(threads.py). A device thread frees a backward's graph task after the backward has returned, and
with it Python objects (the ``contextvars`` context of its thread-local state; with the Python
guard, every device storage's block); a free asking for the GIL once finalizing has begun aborts
the process ("terminate called without an active exception"). Under load that happened in about
a third of the runs of a three-line backward, on both runtimes."""
from __future__ import annotations

import sys

import pytest

from tests.helpers import run_python

pytestmark = [pytest.mark.full, pytest.mark.needs_sim,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads are listed through /proc")]

#: a daemon thread with the name torch gives the autograd engine's thread for device 0, busy
#: (the GIL mostly free) for half a second after the program's last line: the exit must wait for
#: it, as for a device thread still freeing a backward's tensors, or the thread never finishes
PROGRAM = """
import ctypes, sys, threading, time
import torch, flagos_torchfl as ft, flagos_torchfl.sim as fsim
ft.init_backend("sim")
x = torch.ones(3, device="cuda", requires_grad=True)
(x * 2).sum().backward()
assert fsim.runtime_kind() == sys.argv[2]

def device_thread_freeing():
    ctypes.CDLL(None).prctl(15, b"pt_autograd_9", 0, 0, 0)  # PR_SET_NAME
    started.set()
    end = time.monotonic() + 0.5
    while time.monotonic() < end:
        pass
    with open(sys.argv[1], "w") as f:
        f.write("finished")

started = threading.Event()
threading.Thread(target=device_thread_freeing, daemon=True).start()
started.wait()
print("LEAVING", x.grad.sum().item())
"""


@pytest.mark.parametrize("runtime", ["cpp", "python"])
def test_the_exit_waits_for_the_autograd_device_threads(tmp_path, runtime):
    marker = tmp_path / "finished"
    done = run_python(["-c", PROGRAM, str(marker), runtime], env={"FL_BACKEND": "sim", "FL_SIM_RUNTIME": runtime})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "LEAVING 6.0" in done.stdout
    assert marker.read_text() == "finished"


def test_the_real_device_thread_is_found_after_a_backward():
    done = run_python(["-c", "import torch, flagos_torchfl as ft\nft.init_backend('sim')\n"
                       "x = torch.ones(3, device='cuda', requires_grad=True)\n(x * 2).sum().backward()\n"
                       "from flagos_torchfl import threads\nprint('FOUND', len(threads.autograd_device_threads()))"],
                      env={"FL_BACKEND": "sim", "FL_SIM_RUNTIME": "python"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "FOUND 1" in done.stdout
