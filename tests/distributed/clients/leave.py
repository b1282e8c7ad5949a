"""How the client scripts end once their records are written.

torch 2.13 with gloo: destroying a process group, or tearing the interpreter down, can deadlock
when a collective launched during backward is freed on gloo's thread (it needs the GIL for the
autograd context torch keeps in thread-local state) while the main thread frees the group holding
the GIL. The clients therefore run the exit handlers (the launcher's report among them) and leave
without teardown. Each client imports this module from its own folder (``sys.path[0]``).
"""
import atexit
import os
import sys


def leave(code: int = 0) -> None:
    """Run the exit handlers, flush the output and end the process with ``code``."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
