"""Write the patch table of ``docs/design.md`` ("Redirection") from the registry.

Each row is one patch, in the order they apply: the sim's (``sim/integration/torch_patches.py``'s
``PATCHES``, family ``sim``), then the registry's: its name, the module it waits for (``⧗``; none:
applied at activation), the family module that defines it, and the first paragraph of its
docstring. The table lies between the two marker lines :data:`BEGIN` and
:data:`END`; nothing else of the file changes. ``tests/redirect/test_patch_table.py`` fails when
the committed table is not what this writes.

    python tools/patch_table.py           # rewrite the table
    python tools/patch_table.py --check   # exit 1, printing the difference, if it is stale
"""
from __future__ import annotations

import argparse
import difflib
import inspect
import re
import sys
from pathlib import Path

DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"
BEGIN = "<!-- patch table: written by tools/patch_table.py from the registry; do not edit -->"
END = "<!-- end of the patch table -->"
_ROLE = re.compile(r":(?:func|mod|class|meth|data|attr|exc):`~?\.?([^`]+)`")


def markdown(text: str) -> str:
    """``text``, a docstring paragraph in reStructuredText, as one line of Markdown."""
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    text = text.replace("``", "`").replace("|", "\\|")
    return " ".join(text.split())


def rows() -> list:
    """The table's lines: header, rule, one row per patch in the order they apply: the sim's
    (family ``sim``: applied when the sim is installed, for the process), then the registry's."""
    import flagos_torchfl.redirect  # noqa: F401  (registers every family's patches)
    from flagos_torchfl.redirect.patches import REGISTRY
    from flagos_torchfl.sim.integration.torch_patches import PATCHES

    lines = ["| patch | family | what it covers |", "|---|---|---|"]
    for name, _, change in PATCHES:
        lines.append(f"| `{name}` | `sim` | {markdown((inspect.getdoc(change) or '').split(chr(10) * 2)[0])} |")
    for patch in REGISTRY:
        name = f"`{patch.name}`"
        if patch.waits_for:
            name += f" ⧗ `{patch.waits_for.removeprefix('torch.')}`"
        family = patch.apply.__module__.rsplit(".", 1)[-1]
        summary = markdown((inspect.getdoc(patch.apply) or "").split("\n\n")[0])
        lines.append(f"| {name} | `{family}` | {summary} |")
    return lines


def render(document: str) -> str:
    """``document`` with the lines between :data:`BEGIN` and :data:`END` replaced by the table.
    Raises ValueError when either marker is missing."""
    lines = document.split("\n")
    if BEGIN not in lines or END not in lines:
        raise ValueError(f"{DESIGN.name} has no patch table markers ({BEGIN!r} ... {END!r})")
    start, stop = lines.index(BEGIN), lines.index(END)
    return "\n".join(lines[:start + 1] + rows() + lines[stop:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only say whether the table is current")
    args = parser.parse_args()
    document = DESIGN.read_text(encoding="utf-8")
    wanted = render(document)
    if wanted == document:
        return 0
    if args.check:
        sys.stdout.writelines(difflib.unified_diff(document.splitlines(True), wanted.splitlines(True),
                                                   "docs/design.md", "generated"))
        return 1
    DESIGN.write_text(wanted, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
