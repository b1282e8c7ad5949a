"""How the client scripts end: each rank writes its record (:func:`write_record`), then leaves.

torch 2.13 with gloo frees a finished collective on gloo's own thread. When that collective holds
the last reference to a tensor Python has already let go of, freeing it needs the GIL; if the
interpreter is tearing down at that moment, the thread is ended inside a C++ destructor and the
process aborts ("terminate called without an active exception"), and destroying the process group
while the main thread holds the GIL can deadlock the same way. Plain torch does it too, without this
package (docs/design.md, "Exit races in torch's gloo"). The clients therefore run the exit handlers
(the launcher's report among them) and leave without teardown. Clients in this folder import this
module from their own folder (``sys.path[0]``); the accelerate and Lightning clients of
tests/realclients add this folder to their path.
"""
import atexit
import json
import os
import sys


def write_record(out: str, client: str, record: dict) -> None:
    """Write this rank's ``record`` (it holds ``"rank"``) as ``OUT/CLIENT.rankN.json``, the file
    tests/distributed/test_real_clients.py reads."""
    with open(os.path.join(out, f"{client}.rank{record['rank']}.json"), "w") as f:
        json.dump(record, f)


def leave(code: int = 0) -> None:
    """Run the exit handlers, flush the output and end the process with ``code``."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
