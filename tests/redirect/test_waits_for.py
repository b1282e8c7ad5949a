"""Patches that wait for a module (``waits_for``): applied at activation when the program has
imported it, at the program's import otherwise; undone by ``ft.deactivate()``, which also stops
the waiting. Proven with real modules written to a folder on ``sys.path`` and imported for real."""
from __future__ import annotations

import importlib
import importlib.machinery
import sys
import textwrap

import pytest

import flagos_torchfl as ft
from flagos_torchfl import patching, redirect
from flagos_torchfl.redirect import patches

BODY = '''
def greet():
    return "torch's own"
'''


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    """Writes modules into a folder on sys.path; ``scratch(name, body)`` -> name. Forgets them
    (and deactivates) afterwards."""
    monkeypatch.syspath_prepend(str(tmp_path))
    for var in ("FL_BACKEND", "FL_GPU_IDS", "FL_CPU_DEVICES", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    ft.deactivate()
    written = []

    def write(name: str, body: str = BODY) -> str:
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
        written.append(name)
        importlib.invalidate_caches()
        return name

    yield write
    ft.deactivate()
    for name in written:
        sys.modules.pop(name, None)


def _greeting_patch(module_name: str, name: str = "greeting", calls: list = None):
    """A Patch of ``module_name.greet`` waiting for that module; ``calls`` records each run."""

    def apply(target, patcher):
        if calls is not None:
            calls.append(target.chip_name)
        module = sys.modules[module_name]
        patcher.wrap(module, "greet", lambda original: lambda: f"redirected ({original()})")

    apply.__doc__ = "test patch"
    return patches.Patch(name, apply, False, module_name)


def _register(monkeypatch, *extra):
    registry = patches.REGISTRY + list(extra)
    monkeypatch.setattr(patches, "REGISTRY", registry)
    monkeypatch.setattr(redirect, "REGISTRY", registry)


def _hooks():
    return [f for f in sys.meta_path if isinstance(f, patching.ImportHook)]


def test_module_imported_after_activation_is_patched_as_it_is_imported(scratch, monkeypatch):
    name = scratch("fl_scratch_after")
    calls = []
    _register(monkeypatch, _greeting_patch(name, calls=calls))
    ft.init_backend("cpu")
    assert name not in sys.modules and calls == []  # activation imported nothing
    assert "greeting" in redirect.waiting_patches() and "greeting" not in redirect.active_patches()
    module = importlib.import_module(name)
    assert module.greet() == "redirected (torch's own)" and calls == ["cpu"]
    assert "greeting" not in redirect.waiting_patches() and redirect.active_patches()[-1] == "greeting"
    assert module.__loader__ is module.__spec__.loader
    assert isinstance(module.__loader__, importlib.machinery.SourceFileLoader)  # its own, not the hook's
    ft.deactivate()
    assert module.greet() == "torch's own" and _hooks() == []


def test_module_imported_before_activation_is_patched_at_activation(scratch, monkeypatch):
    name = scratch("fl_scratch_before")
    module = importlib.import_module(name)
    _register(monkeypatch, _greeting_patch(name))
    ft.init_backend("cpu")
    assert module.greet() == "redirected (torch's own)"
    assert "greeting" in redirect.active_patches() and "greeting" not in redirect.waiting_patches()
    ft.deactivate()
    assert module.greet() == "torch's own"


def test_module_imported_after_deactivation_is_untouched(scratch, monkeypatch):
    name = scratch("fl_scratch_late")
    calls = []
    _register(monkeypatch, _greeting_patch(name, calls=calls))
    ft.init_backend("cpu")
    assert len(_hooks()) == 1
    ft.deactivate()
    assert _hooks() == []
    module = importlib.import_module(name)
    assert module.greet() == "torch's own" and calls == []


def test_reactivation_waits_again_and_applies_once(scratch, monkeypatch):
    first, second = scratch("fl_scratch_first"), scratch("fl_scratch_second")
    calls = []
    _register(monkeypatch, _greeting_patch(first, "first", calls), _greeting_patch(second, "second", calls))
    ft.init_backend("cpu")
    one = importlib.import_module(first)
    ft.deactivate()
    assert one.greet() == "torch's own"
    ft.init_backend("cpu")  # first is imported now: applied at once; second still waits
    assert one.greet() == "redirected (torch's own)"
    assert "second" in redirect.waiting_patches() and "first" not in redirect.waiting_patches()
    two = importlib.import_module(second)
    assert two.greet() == "redirected (torch's own)" and calls == ["cpu"] * 3
    assert len(_hooks()) == 1  # one hook per activation, never stacked
    ft.deactivate()
    assert (one.greet(), two.greet()) == ("torch's own", "torch's own")


def test_failing_patch_at_import_is_undone_alone_and_the_import_succeeds(scratch, monkeypatch):
    name = scratch("fl_scratch_fault")
    marker = scratch("fl_scratch_marker", "value = 1\n")
    marker_module = importlib.import_module(marker)

    def broken(target, patcher):
        patcher.setattr(marker_module, "value", 2)
        raise RuntimeError("injected fault")

    broken.__doc__ = "test patch"
    _register(monkeypatch, patches.Patch("broken", broken, False, name), _greeting_patch(name))
    ft.init_backend("cpu")
    with pytest.warns(RuntimeWarning, match=r"redirect patch 'broken' of fl_scratch_fault failed "
                                            r"\(RuntimeError: injected fault\)"):
        module = importlib.import_module(name)
    assert marker_module.value == 1  # the broken patch's own change was taken back
    assert module.greet() == "redirected (torch's own)"  # the next patch of the module still ran
    assert "broken" not in redirect.active_patches() + redirect.waiting_patches()
    ft.deactivate()
    assert module.greet() == "torch's own"


def test_failing_patch_of_an_imported_module_fails_activation(scratch, monkeypatch, torch_state):
    name = scratch("fl_scratch_now")
    importlib.import_module(name)

    def broken(target, patcher):
        raise RuntimeError("injected fault")

    _register(monkeypatch, patches.Patch("broken", broken, False, name))
    before = torch_state.snapshot()
    with pytest.raises(ft.ActivationError, match="'broken' failed .*nothing was changed"):
        ft.init_backend("cpu")
    assert torch_state.difference(before, torch_state.snapshot()) == [] and _hooks() == []


def test_deactivation_during_the_import_leaves_the_module_untouched(scratch, monkeypatch):
    name = scratch("fl_scratch_midway", BODY + "import flagos_torchfl\nflagos_torchfl.deactivate()\n")
    calls = []
    _register(monkeypatch, _greeting_patch(name, calls=calls))
    ft.init_backend("cpu")
    module = importlib.import_module(name)
    assert ft.current_backend() is None and calls == [] and module.greet() == "torch's own"


def test_a_replacement_taken_by_name_while_active_is_given_back(scratch, monkeypatch):
    source = importlib.import_module(scratch("fl_scratch_source"))
    taker = scratch("fl_scratch_taker", "from fl_scratch_source import greet\n")
    original = source.greet

    def replace(target, patcher):
        patcher.replace_in([source], "greet", original, lambda: "redirected")

    replace.__doc__ = "test patch"
    _register(monkeypatch, patches.Patch("replace", replace, False))
    ft.init_backend("cpu")
    module = importlib.import_module(taker)  # takes the replacement by name
    assert module.greet() == "redirected"
    ft.deactivate()
    assert module.greet is original and source.greet is original


def test_waits_for_must_name_a_module():
    with pytest.raises(ValueError, match="waits_for must be a dotted module name, not 'torch..fsdp'"):
        patches.patch_function("bad_wait", waits_for="torch..fsdp")
    assert "bad_wait" not in [p.name for p in patches.REGISTRY]


def test_hook_ignores_modules_it_does_not_wait_for():
    hook = patching.ImportHook()
    assert hook.find_spec("json") is None
    seen = []
    hook.wait_for("fl_never_written", seen.append)
    try:
        assert hook in sys.meta_path and hook.waiting() == ["fl_never_written"]
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("fl_never_written")
    finally:
        hook.remove()
    assert hook not in sys.meta_path and hook.waiting() == [] and seen == []


def test_a_module_whose_import_activates_is_patched_once_its_import_has_finished(scratch, monkeypatch):
    # the module is in sys.modules, still executing, when activation queues its patch
    name = scratch("fl_scratch_self", BODY + "import flagos_torchfl\nflagos_torchfl.init_backend('cpu')\n")
    later = scratch("fl_scratch_after_self", "value = 1\n")
    _register(monkeypatch, _greeting_patch(name))
    module = importlib.import_module(name)
    importlib.import_module(later)  # the program goes on importing
    assert module.greet() == "redirected (torch's own)"
    assert "greeting" in redirect.active_patches() and "greeting" not in redirect.waiting_patches()
    ft.deactivate()
    assert module.greet() == "torch's own" and _hooks() == []


def test_a_module_imported_while_its_patch_is_queued_is_patched_at_once(scratch, monkeypatch):
    # interleaving injected: another import of the module completes between activation's
    # "not imported yet" and the hook's registration
    name = scratch("fl_scratch_race")
    original = patching.ImportHook.wait_for

    def wait_for(self, module, callback):
        if module == name:  # the package's own waiting patches (DeepSpeed's) keep waiting
            importlib.import_module(module)
        original(self, module, callback)

    monkeypatch.setattr(patching.ImportHook, "wait_for", wait_for)
    _register(monkeypatch, _greeting_patch(name))
    ft.init_backend("cpu")
    assert sys.modules[name].greet() == "redirected (torch's own)"
    assert "greeting" in redirect.active_patches() and "greeting" not in redirect.waiting_patches()


class _RefusesRestore(dict):
    """A namespace that takes one change, then refuses the one that would put it back."""

    writes = 0

    def __setitem__(self, key, value):
        self.writes += 1
        if self.writes > 1:
            raise PermissionError("read-only namespace")
        super().__setitem__(key, value)


def test_a_failing_patch_whose_undo_fails_too_never_breaks_the_import(scratch, monkeypatch):
    name = scratch("fl_scratch_undo")
    namespace = _RefusesRestore(value=1)

    def broken(target, patcher):
        patcher.setitem(namespace, "value", 2)
        raise RuntimeError("injected fault")

    _register(monkeypatch, patches.Patch("broken", broken, False, name), _greeting_patch(name))
    ft.init_backend("cpu")
    with pytest.warns(RuntimeWarning, match=r"'broken' of fl_scratch_undo failed \(RuntimeError: injected "
                                            r"fault\).*taking its changes back failed too .*read-only namespace"):
        module = importlib.import_module(name)
    assert module.greet() == "redirected (torch's own)"


def test_a_warning_raised_as_an_error_does_not_stop_the_import_or_the_next_patch(scratch, monkeypatch):
    import warnings

    name = scratch("fl_scratch_strict")

    def broken(target, patcher):
        raise RuntimeError("injected fault")

    _register(monkeypatch, patches.Patch("broken", broken, False, name), _greeting_patch(name))
    ft.init_backend("cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # python -W error: the RuntimeWarning raises
        module = importlib.import_module(name)
    assert module.greet() == "redirected (torch's own)"
