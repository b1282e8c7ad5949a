"""docs/design.md's patch table is the patches': the sim's and every registered one, in order, as
``tools/patch_table.py`` writes it."""
from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import ROOT


def _tool():
    spec = importlib.util.spec_from_file_location("patch_table", ROOT / "tools" / "patch_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_table_is_the_registrys():
    tool = _tool()
    document = tool.DESIGN.read_text(encoding="utf-8")
    assert tool.render(document) == document, "docs/design.md's patch table is stale: run python tools/patch_table.py"


def test_every_patch_has_a_row_in_order():
    from flagos_torchfl.redirect.patches import REGISTRY
    from flagos_torchfl.sim.integration.torch_patches import PATCHES

    tool = _tool()
    names = [row.split("`")[1] for row in tool.rows()[2:]]
    assert names == [name for name, _, _ in PATCHES] + [p.name for p in REGISTRY]


def test_a_patch_registered_later_makes_the_table_stale():
    """A new patch (injected into the registry) is missing from the committed table."""
    from flagos_torchfl.redirect.patches import REGISTRY, Patch

    def extra(target, patcher):
        """``torch.example``: a patch the table does not have yet."""

    tool = _tool()
    document = tool.DESIGN.read_text(encoding="utf-8")
    REGISTRY.append(Patch("example_patch", extra, on_cuda=False))
    try:
        rendered = tool.render(document)
    finally:
        REGISTRY.pop()
    assert rendered != document and "| `example_patch` | `test_patch_table` | `torch.example`: a patch" in rendered


def test_a_document_without_markers_is_refused():
    with pytest.raises(ValueError, match="no patch table markers"):
        _tool().render("# design\n| patch | what |\n")


def test_patches_apply_family_by_family_in_the_declared_order():
    """Each family's patches come after every patch of the families ``FAMILIES`` puts before it,
    and every family registers at least one patch."""
    from flagos_torchfl.redirect import FAMILIES, REGISTRY

    families = [p.apply.__module__.rsplit(".", 1)[-1] for p in REGISTRY]
    assert [FAMILIES.index(f) for f in families] == sorted(FAMILIES.index(f) for f in families)
    assert set(families) == set(FAMILIES)
