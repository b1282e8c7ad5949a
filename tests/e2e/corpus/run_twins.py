"""Runs CPU twins one after another in this one interpreter, each as ``__main__`` with its own
argv and its folder first on ``sys.path``, as ``python TWIN`` would:

    python run_twins.py OUT_DIR TWIN.py [TWIN.py ...]

Plain PyTorch, nothing activated: each twin seeds the generators it uses, so it prints what it
prints when run alone. A twin's output goes to ``OUT_DIR/<name>.out``; a twin that raises or
exits non-zero writes its traceback or code to ``OUT_DIR/<name>.err`` and the twins after it
still run. The exit status is 1 if any twin failed.
"""
import contextlib
import os
import runpy
import sys
import traceback


def run_twin(path: str, out_dir: str) -> bool:
    """Run the twin at ``path``; its stdout to ``<name>.out``; whether it succeeded."""
    name = os.path.basename(path)
    error = None
    sys.argv = [path]
    sys.path[0] = os.path.dirname(os.path.abspath(path))
    with open(os.path.join(out_dir, f"{name}.out"), "w") as out, contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
        except SystemExit as exc:
            if exc.code not in (None, 0):
                error = f"exit {exc.code}\n"
        except BaseException:  # noqa: BLE001 - reported in the twin's .err, the next twins run
            error = traceback.format_exc()
        sys.stdout.flush()
    if error is not None:
        with open(os.path.join(out_dir, f"{name}.err"), "w") as err:
            err.write(error)
    return error is None


if __name__ == "__main__":
    out_dir, *twins = sys.argv[1:]
    results = [run_twin(twin, out_dir) for twin in twins]
    sys.exit(0 if all(results) else 1)
