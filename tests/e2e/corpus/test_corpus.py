"""The corpus: CUDA-written scripts run unchanged through flagos_torchfl and print exactly the
losses of their CPU twins (the same computation written plainly for the CPU).

Each script runs the three-line way (``run_with_ft.py``: import, ``ft.auto_select_backend()``,
then the script) and, where the launcher exists, as ``python -m flagos_torchfl run script.py``.
When the selected backend is CUDA itself (NVIDIA, ROCm) the reference is the script run plainly,
compared to a relative 1e-5 (GPU kernels may reduce in varying order); otherwise the twin's
printed floats must be equal to the last digit. The twins are plain PyTorch that seed what they
use: they run one after another in one interpreter (``run_twins.py``).
"""
from __future__ import annotations

import concurrent.futures
import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: the first test's setup runs every script (16 x 2 runs and the twins, two at a time): past pytest's 600 s on
#: torch 2.14.1 on a loaded 2-core VM
pytestmark = pytest.mark.timeout(3600)
CORPUS = Path(__file__).resolve().parent
TWINS = CORPUS / "cpu_twins"
SCRIPTS = sorted(
    p.name for p in CORPUS.glob("*.py") if not p.name.startswith(("test_", "run_")) and p.name != "conftest.py"
)
#: the compat features a script (or its twin) uses, from its ``# torch features: a, b`` line:
#: on a torch without one the script cannot apply, and is reported skipped
FEATURES = {s: [name.strip() for line in (CORPUS / s).read_text().splitlines()
                if line.startswith("# torch features:") for name in line.split(":", 1)[1].split(",")]
            for s in SCRIPTS}
MODES = ["api"] + (["launcher"] if importlib.util.find_spec("flagos_torchfl.cli.run") else [])
#: per run; torch.compile's first compile of torch_compile_mlp.py took 230 s on torch 2.14.1 on a loaded 2-core VM
TIMEOUT = 900


def _native_cuda() -> bool:
    """Whether auto-selection here picks a backend whose device type is cuda."""
    from flagos_torchfl.backends import get_backend
    from flagos_torchfl.selection import would_pick

    name, _why = would_pick()
    return name is not None and get_backend(name).device_type == "cuda"


def _command(mode: str, script: str) -> list:
    if mode == "plain":
        return [sys.executable, str(CORPUS / script)]
    if mode == "api":
        return [sys.executable, str(CORPUS / "run_with_ft.py"), str(CORPUS / script)]
    return [sys.executable, "-m", "flagos_torchfl", "run", str(CORPUS / script)]


def _run(mode: str, script: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED="0")
    command = _command(mode, script)
    try:
        return subprocess.run(command, cwd=CORPUS, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as exc:  # this run fails; the others still report
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return subprocess.CompletedProcess(command, -9, out, f"timed out after {TIMEOUT} s")


def losses(output: str) -> list:
    """The ``loss <step> <value>`` lines of a run, as (step, value text)."""
    found = []
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "loss":
            found.append((parts[1], parts[2]))
    return found


def _twins(scripts, out_dir: Path) -> dict:
    """script -> its twin's run as a CompletedProcess: the twins run one after another in one
    interpreter (``run_twins.py``: plain PyTorch, every twin seeds what it uses, so each prints
    what it prints alone), which spares an interpreter start-up per script."""
    command = [sys.executable, str(CORPUS / "run_twins.py"), str(out_dir), *[str(TWINS / s) for s in scripts]]
    env = dict(os.environ, PYTHONHASHSEED="0")
    try:
        proc = subprocess.run(command, cwd=CORPUS, env=env, capture_output=True, text=True, timeout=2 * TIMEOUT)
        whole = proc.stderr[-3000:]
    except subprocess.TimeoutExpired:  # the twins that finished still report
        whole = f"the twins' run timed out after {2 * TIMEOUT} s"
    found = {}
    for s in scripts:
        out, err = out_dir / f"{s}.out", out_dir / f"{s}.err"
        failed = err.exists() or not out.exists()
        detail = (err.read_text() if err.exists() else "") + whole
        found[s] = subprocess.CompletedProcess(command, 1 if failed else 0, out.read_text() if out.exists() else "",
                                               detail if failed else "")
    return found


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    """Every run the selected tests need (every script in every mode, unless ``-k`` or
    ``--deselect`` leave some out), two at a time (the machine has two cores); the twins, when
    they are the reference, in one interpreter beside the others (:func:`_twins`)."""
    reference = "plain" if _native_cuda() else "twin"
    selected = {(item.callspec.params["mode"], item.callspec.params["script"]) for item in request.session.items
                if item.module is request.module and "script" in getattr(getattr(item, "callspec", None), "params", {})
                and item.get_closest_marker("skip") is None}
    scripts = sorted({s for _, s in selected})
    jobs = ([] if reference == "twin" else [(reference, s) for s in scripts]) + sorted(selected)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        twins = pool.submit(_twins, scripts, tmp_path_factory.mktemp("twins")) if reference == "twin" else None
        results = dict(zip(jobs, pool.map(lambda job: _run(*job), jobs)))
    if twins is not None:
        results.update({("twin", s): proc for s, proc in twins.result().items()})
    return reference, results


def test_corpus_is_complete():
    assert len(SCRIPTS) >= 12
    missing = [s for s in SCRIPTS if not (TWINS / s).exists()]
    assert not missing, f"scripts without a CPU twin: {missing}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("script", [pytest.param(s, marks=[pytest.mark.torch_feature(f) for f in FEATURES[s]])
                                    for s in SCRIPTS])
def test_script_matches_its_reference(runs, script, mode):
    reference, results = runs
    ref, got = results[(reference, script)], results[(mode, script)]
    assert ref.returncode == 0, f"{reference} run of {script} failed:\n{ref.stderr[-3000:]}"
    assert got.returncode == 0, f"{mode} run of {script} failed:\n{got.stderr[-3000:]}"
    expected, actual = losses(ref.stdout), losses(got.stdout)
    assert len(expected) >= 4, f"{script} printed too few losses:\n{ref.stdout}"
    if reference == "twin":
        assert actual == expected
    else:
        assert [s for s, _ in actual] == [s for s, _ in expected]
        for (_, a), (_, e) in zip(actual, expected):
            assert math.isclose(float(a), float(e), rel_tol=1e-5), (a, e)
