"""What the plugin guard (``flagos_torchfl/autoload.py``) costs a process the package starts.

    python benchmarks/plugin_guard.py [--plugin-dir DIR] [--runs 7]

Fresh interpreters, interleaved, median of ``--runs``:

- ``import torch`` plain, and after the guard: with no ``torch.backends`` entry point installed
  (one scan of the installed distributions), and with the parent's record inherited (what a child
  under ``run`` pays);
- with ``--plugin-dir`` (a folder holding a device plugin that cannot load, e.g. torch-npu 2.13.0
  installed with ``pip install --no-deps --target DIR``): the guard's child-interpreter probe, against
  ``import torch`` with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (plain ``import torch`` fails there).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

GUARD = Path(__file__).resolve().parent.parent / "src" / "flagos_torchfl" / "autoload.py"
LOAD = ("from importlib.util import module_from_spec, spec_from_file_location\n"
        f"spec = spec_from_file_location('guard', {str(GUARD)!r}); guard = module_from_spec(spec)\n"
        "spec.loader.exec_module(guard)\n")
TIMED = "import time\nt = time.perf_counter()\n{body}\nprint(time.perf_counter() - t)\n"


def once(body: str, env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", TIMED.format(body=body)], env=env, capture_output=True,
                         text=True, timeout=600, check=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--plugin-dir")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    base = {k: v for k, v in os.environ.items() if not k.startswith("FL_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    record = subprocess.run([sys.executable, "-c", LOAD + "import json; print(json.dumps(guard.guard({})))"],
                            env=base, capture_output=True, text=True, check=True).stdout.strip()
    cases = {
        "import torch": ("import torch", base),
        "guard (scan, no plugin) + import torch": (LOAD + "guard.guard()\nimport torch", base),
        "guard (inherited record) + import torch": (LOAD + "guard.guard()\nimport torch",
                                                    {**base, "FL_PLUGIN_AUTOLOAD": record}),
    }
    if args.plugin_dir:
        with_plugin = {**base, "PYTHONPATH": os.pathsep.join(filter(None, [args.plugin_dir, base.get("PYTHONPATH")]))}
        cases["plugin installed: import torch, auto-load off"] = (
            "import torch", {**with_plugin, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
        cases["plugin installed: guard (child probe) + import torch"] = (
            LOAD + "assert guard.guard()['disabled']\nimport torch", with_plugin)
    times = {name: [] for name in cases}
    for _ in range(args.runs):
        for name, (body, env) in cases.items():
            times[name].append(once(body, env))
    reference = statistics.median(times["import torch"])
    print(f"{'case':55} {'median s':>9} {'vs import torch':>16}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:55} {median:9.3f} {median / reference:16.2f}")
    print(json.dumps({name: statistics.median(v) for name, v in times.items()}))


if __name__ == "__main__":
    main()
