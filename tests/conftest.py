"""Test harness.

Two tiers. ``python -m pytest -q`` runs the quick tier: the unit and in-process tests of every
layer, a few minutes on a 2-core machine. ``python -m pytest -q --all`` runs the full suite, what
``.ci/run`` runs: the quick tier plus every test that starts programs of its own (torchrun jobs,
the launcher, the command line, third-party programs, the real vendor wheels, PyTorch's
conformance samples). :data:`FULL_ONLY` names the folders and modules that belong to the full
suite only, and ``@pytest.mark.full`` marks single tests; a folder or module named on the command
line (``python -m pytest tests/e2e``) runs whole. In the quick tier a test that starts a
Python interpreter fails, naming the rule, so the tier stays what it says.

Modules that set ``pytestmark = pytest.mark.isolated`` run in a fresh interpreter of their own:
things that cannot be undone inside one process (claiming PyTorch's PrivateUse1 slot for ``sim``,
importing a fake vendor plugin) must not leak into other tests. The first test of such a module
runs the whole module once in a child pytest; each test then reports its own outcome from there.
"""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

IN_CHILD = os.environ.get("FL_TEST_ISOLATED_CHILD") == "1"
ROOT = Path(__file__).resolve().parent.parent
_results: dict[str, dict[str, tuple[str, str]]] = {}

#: what only the full suite runs (paths under tests/, a folder or a module) and why
FULL_ONLY = {
    "e2e": "real programs run whole: CUDA-written scripts, third-party programs (transformers, "
           "accelerate, Lightning, DeepSpeed ...), torchrun jobs, real vendor wheels, PyTorch's "
           "OpInfo samples through every route",
    "test_autoload.py": "interpreters with plug-ins that fail to load",
    "test_checkpoint.py": "checkpoints loaded in fresh interpreters",
    "test_checkpoint_safety.py": "checkpoint writers killed mid-write",
    "test_faults.py": "faults injected into child interpreters",
    "test_import.py": "fresh interpreters importing the package",
    "test_inherit.py": "children of activated programs",
    "test_memory_vendor.py": "fake vendor plug-ins in fresh interpreters",
    "test_startup_modules.py": "fresh interpreters' module lists",
    "tables/test_device_modules.py": "the real vendor wheels, installed into folders of their own",
    "backends/test_new_chip.py": "a third-party chip installed and launched",
    "machine/test_probe_hang.py": "query tools and plug-ins that hang",
    "backends/test_profile_queries.py": "a fresh interpreter per profile",
    "cli/test_cli.py": "the command line as a program",
    "cli/test_launcher_children.py": "the launcher's child processes",
    "cli/test_launcher_run.py": "programs under the launcher",
    "k8s/test_k8s_labels.py": "the labelling command as a program",
    "precision/test_train_activated.py": "training runs compared across backends",
    "precision/test_train_mixed.py": "training runs compared across backends",
    "redirect/test_barrier_gpu_ids.py": "a process group on three sim devices",
    "redirect/test_clean_exit.py": "jobs that end in each way, in fresh interpreters",
    "redirect/test_compile_fallback.py": "torch.compile in a fresh interpreter",
    "redirect/test_compile_step_hooks.py": "torch.compile in fresh interpreters",
    "redirect/test_fsdp1_device_id.py": "FSDP1 in a one-rank process group",
    "redirect/test_patch_import_order.py": "fresh interpreters per import order",
    "routing/test_ops_cli.py": "the ops command as a program",
    "routing/test_real_models.py": "transformers models on every route",
    "sim/integration/test_sim_collectives.py": "2-process jobs on the sim's collectives",
}
#: set in the environment of every interpreter the tests start, so that the quick tier's rule
#: (no interpreter of a test's own) holds in isolated modules' children too
TIER = "FL_TEST_TIER"


#: what needs the sim device throughout (paths under tests/, a folder or a module; its own floor:
#: compat.SIM_MIN_TORCH)
SIM_SUITES = ("sim", "e2e/conformance", "tables/test_op_tables.py", "backends/test_profiles.py",
              "backends/test_profile_ascend.py", "backends/test_profile_ascend_910a.py",
              "backends/test_profile_queries.py", "backends/test_profile_rename_refused.py",
              "e2e/test_profile_models.py", "e2e/test_fallback_budget.py")


def pytest_addoption(parser):
    parser.addoption("--all", action="store_true", default=False,
                     help="run the full suite (what .ci/run runs), not only the quick tier")


def _full(config) -> bool:
    return config.getoption("--all") or os.environ.get(TIER) == "full"


def pytest_configure(config):
    os.environ[TIER] = "full" if _full(config) else "quick"
    config.addinivalue_line("markers", "full: in the full suite only (python -m pytest --all)")
    config.addinivalue_line("markers", "isolated: run this module in a fresh interpreter")
    config.addinivalue_line(
        "markers", "torch_feature(name): needs compat feature NAME of the torch under test; "
        "skipped, with the reason, on a torch without it")
    config.addinivalue_line("markers", "needs_sim: needs the sim device (torch_feature python_privateuse1_backend)")


def _torch_feature_skips(items) -> None:
    """Tests that cannot apply to the torch under test (it lacks what they exercise) are
    skipped with the reason, so the summary counts them as skipped, never as passed."""
    import torch

    from flagos_torchfl import compat

    for item in items:
        names = [m.args[0] for m in item.iter_markers("torch_feature")]
        if item.get_closest_marker("needs_sim") is not None or _under(item, SIM_SUITES):
            names.append("python_privateuse1_backend")
        missing = [n for n in names if not compat.has(n)]
        if missing:
            what = "; ".join(compat.FEATURES[n].what for n in missing)
            item.add_marker(pytest.mark.skip(reason=f"torch {torch.__version__} lacks {what}"))


def _starts_python(args) -> bool:
    argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
    program = os.fsdecode(argv[0]) if argv else ""
    return program == sys.executable or os.path.basename(program).startswith("python")


@pytest.fixture(autouse=True)
def _quick_tier_runs_in_process(request, monkeypatch):
    """In the quick tier, a test that starts a Python interpreter of its own fails (mark it
    ``full``, or list its module in :data:`FULL_ONLY`)."""
    if os.environ.get(TIER) != "quick" or _full_only(request.node):  # (an isolated module's parent
        yield                                                          # item sets up no fixture)
        return
    original = subprocess.Popen.__init__

    def refuse(self, args, *rest, **kwargs):
        if _starts_python(args):
            raise AssertionError(
                f"{request.node.nodeid} starts a Python interpreter ({args!r}): quick-tier tests run "
                "in-process; mark it @pytest.mark.full or list its module in tests/conftest.py FULL_ONLY")
        original(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield


def _run_module_in_child(path: Path, tmp_dir: Path, whole: bool) -> dict[str, tuple[str, str]]:
    """Run the isolated module ``path`` in a child pytest (``whole``: every test of it, as the
    full suite, because the command line named it; else in this run's tier)."""
    report = tmp_dir / f"{path.stem}.xml"
    env = dict(os.environ, FL_TEST_ISOLATED_CHILD="1")
    if whole:
        env[TIER] = "full"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider", "-n", "0",
         f"--junitxml={report}"],  # in this one process: no workers of its own
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )
    outcomes: dict[str, tuple[str, str]] = {}
    if report.exists():
        for case in ET.parse(report).iter("testcase"):
            name = case.get("name")
            outcome, detail = "passed", ""
            for tag in ("failure", "error", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome = tag
                    detail = (node.get("message") or "") + "\n" + (node.text or "")
            outcomes[name] = (outcome, detail)
    outcomes["<process>"] = ("exit", f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return outcomes


def pytest_runtest_call(item):
    if IN_CHILD or item.get_closest_marker("isolated") is None:
        return None
    path = Path(item.fspath)
    if str(path) not in _results:
        tmp_dir = item.config._tmp_path_factory.mktemp("isolated")  # type: ignore[attr-defined]
        named = any(path.resolve() == n or path.resolve().is_relative_to(n) for n in _named(item.config))
        _results[str(path)] = _run_module_in_child(path, tmp_dir, whole=named)
    outcomes = _results[str(path)]
    outcome, detail = outcomes.get(item.name, ("missing", outcomes["<process>"][1]))
    if outcome == "skipped":
        pytest.skip(detail.strip().splitlines()[0] if detail.strip() else "skipped in child")
    if outcome != "passed":
        pytest.fail(f"[isolated child] {outcome}:\n{detail}", pytrace=False)


def _under(item, paths) -> bool:
    """Whether ``item``'s module is one of ``paths`` (under tests/) or in one of those folders."""
    rel = Path(str(item.fspath)).resolve().relative_to(ROOT / "tests").as_posix()
    return any(rel == path or rel.startswith(path + "/") for path in paths)


def _full_only(item) -> bool:
    return item.get_closest_marker("full") is not None or _under(item, FULL_ONLY)


def _named(config) -> list:
    """The folders and modules the command line names below ``tests/`` (``tests`` itself and no
    argument name none: the tier decides there)."""
    found = []
    for arg in config.args:
        path = Path(config.invocation_params.dir, arg.split("::")[0]).resolve()
        if path not in (ROOT, ROOT / "tests") and path.is_relative_to(ROOT / "tests"):
            found.append(path)
    return found


def pytest_collection_modifyitems(config, items):
    # the quick tier leaves out what only the full suite runs, unless the command line names it
    # (``python -m pytest tests/e2e``); an isolated module's child follows its parent's tier
    named = [] if IN_CHILD else _named(config)
    if not _full(config):
        def kept(item) -> bool:
            path = Path(str(item.fspath)).resolve()
            return not _full_only(item) or any(path == n or path.is_relative_to(n) for n in named)

        dropped = [item for item in items if not kept(item)]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = [item for item in items if kept(item)]
    _torch_feature_skips(items)
    # In the parent, an isolated test's fixtures are not set up either: they may do what cannot
    # be undone (the child sets them up for real).
    if not IN_CHILD:
        for item in items:
            if item.get_closest_marker("isolated") is not None:
                item.fixturenames[:] = [n for n in item.fixturenames if n in ("request",)]


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    # In the parent, an isolated test's body already ran in the child: do not run it again here.
    if not IN_CHILD and pyfuncitem.get_closest_marker("isolated") is not None:
        return True
    return None
