"""How the client scripts end: each rank writes its record (:func:`write_record`), then leaves.

Under flagos_torchfl (the launcher's runs) a client ends as its program would: the interpreter
exits, and the package's ``clean_exit`` patch lets gloo's worker threads free their last works
before it finalizes (docs/design.md, "Exit races in torch's gloo").

The plain-torch reference runs (``--cpu``, ``ACCELERATE_USE_CPU=true``...) have no such help: torch
2.13 with gloo frees a finished collective on gloo's own thread, and when the interpreter is
finalizing at that moment the process aborts ("terminate called without an active exception"),
and freeing the process group while the main thread holds the GIL can deadlock the same way.
There the clients run the exit handlers and leave without teardown (:func:`leave`). Clients in
this folder import this module from their own folder (``sys.path[0]``).
"""
import atexit
import json
import os
import sys


def write_record(out: str, client: str, record: dict) -> None:
    """Write this rank's ``record`` (it holds ``"rank"``) as ``OUT/CLIENT.rankN.json``, the file
    tests/e2e/test_distributed_clients.py reads."""
    with open(os.path.join(out, f"{client}.rank{record['rank']}.json"), "w") as f:
        json.dump(record, f)


def activated() -> bool:
    """Whether flagos_torchfl is active in this process."""
    ft = sys.modules.get("flagos_torchfl")
    return ft is not None and ft.current_backend() is not None


def end_group() -> None:
    """End the default process group: under flagos_torchfl as the program would
    (``dist.destroy_process_group()``, which its ``clean_exit`` patch makes safe); plain torch
    leaves it to :func:`leave`, because freeing a gloo group there can deadlock (a reference run
    of ddp_dcp.py hung so, killed after 400 s)."""
    if activated():
        import torch.distributed as dist

        dist.destroy_process_group()


def leave() -> None:
    """Under flagos_torchfl return, so that the program ends normally. Plain torch: run the exit
    handlers, flush the output and end the process with 0 without the interpreter's teardown."""
    if activated():
        return
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
