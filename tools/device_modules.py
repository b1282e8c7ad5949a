"""Write ``src/flagos_torchfl/data/device_modules/<chip>.json``: the public names of a vendor's
device module (what ``torch.npu`` / ``torch.mlu`` / ``torch.musa`` offer), read from the vendor's
own sources without importing them (``ast``: no plugin, no device runtime needed).

The committed tables were written by:

    pip download --no-deps torch-npu==2.13.0 -d /tmp/npu
    python tools/device_modules.py ascend /tmp/npu/torch_npu-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl
    git clone https://github.com/Cambricon/torch_mlu /tmp/torch_mlu
    python tools/device_modules.py cambricon /tmp/torch_mlu --repository Cambricon/torch_mlu --ref r2.4_develop
    git clone https://github.com/MooreThreads/torch_musa /tmp/torch_musa
    python tools/device_modules.py mthreads /tmp/torch_musa --repository MooreThreads/torch_musa --ref main

Sources:

- ``ascend``: ``torch_npu/npu/__init__.py`` of the torch_npu wheel, its ``__all__`` (torch_npu
  registers ``torch_npu.npu`` as ``torch.npu``).
- ``cambricon``: ``torch_mlu/mlu/__init__.py`` of Cambricon/torch_mlu at ``--ref``, its
  ``__all__`` (``torch.mlu``).
- ``mthreads``: ``torch_musa/__init__.py`` of MooreThreads/torch_musa at ``--ref``: the module
  itself is ``torch.musa`` (``torch.__setattr__("musa", sys.modules[__name__])``) and has no
  ``__all__``, so its public names are those it binds at top level: its functions, classes and
  assignments, names imported from its own package, and the names of ``from .x import *``
  (that module's ``__all__``, else its public top-level names); names imported from other
  packages (``torch``, ``typing``) are left out.

Output (UTF-8 JSON, two-space indent, lists sorted, trailing newline; the same source and the same
torch give byte-identical files):

- ``schema`` 1, ``chip``, ``module`` (the vendor module read), ``device_module`` (``torch.npu``).
- ``source``: ``kind`` ``"wheel"`` (``package``, ``version``, ``file``, ``file_sha256``, ``path``,
  ``sha256`` of the file read) or ``"repository"`` (``repository``, ``ref``, ``commit``, ``date``,
  ``path``, ``sha256``), and ``names_from`` (``"__all__"`` or ``"top-level bindings"``).
- ``torch_checked``: the torch whose ``torch.cuda.__all__`` the names were compared with.
- ``names``: every public name the source lists, kept whether or not torch.cuda has it.
- ``not_in_torch_cuda``: those names ``torch.cuda.__all__`` does not have (the chip's own).
- ``torch_cuda_missing``: names of ``torch.cuda.__all__`` the module does not have.
- ``counts``: the length of each list.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Callable, Optional, Set

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "src" / "flagos_torchfl" / "data" / "device_modules"
CHIPS = {
    # chip: (file read, vendor module, torch device module, how names are read)
    "ascend": ("torch_npu/npu/__init__.py", "torch_npu.npu", "torch.npu", "__all__"),
    "cambricon": ("torch_mlu/mlu/__init__.py", "torch_mlu.mlu", "torch.mlu", "__all__"),
    "mthreads": ("torch_musa/__init__.py", "torch_musa", "torch.musa", "top-level bindings"),
}


def all_names(tree: ast.Module, where: str) -> list:
    """The literal ``__all__`` of a module (a list or tuple, possibly ``+=``-extended)."""
    names: list = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AugAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            names += list(ast.literal_eval(node.value))
    if not names:
        raise ValueError(f"{where}: no literal __all__")
    return names


def _walk_top(body):
    """Top-level statements, including those inside ``if`` / ``try`` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _walk_top(node.body + node.orelse)
        elif isinstance(node, ast.Try):
            yield from _walk_top(node.body + node.orelse + node.finalbody
                                 + [s for h in node.handlers for s in h.body])


def top_level_names(tree: ast.Module, package: str, module: str, read: Callable[[str], Optional[str]]) -> Set[str]:
    """Public names ``module`` (dotted, inside ``package``) binds at top level; see the module
    docstring. ``read(path)`` returns a file of the source tree, or None."""
    names: Set[str] = set()
    for node in _walk_top(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node.level, node.module)
            if source is None or not (source == package or source.startswith(package + ".")):
                continue
            for alias in node.names:
                if alias.name == "*":
                    names.update(_star(source, package, read))
                else:
                    names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(package + ".") and alias.asname:
                    names.add(alias.asname)
    return {n for n in names if not n.startswith("_")}


def _resolve(module: str, level: int, name: Optional[str]) -> Optional[str]:
    if level == 0:
        return name
    base = module.split(".")  # a package's own file is "<package>.__init__"
    base = base[:len(base) - level]
    return ".".join([*base, name] if name else base) or None


def _star(source: str, package: str, read: Callable[[str], Optional[str]]) -> Set[str]:
    path = source.replace(".", "/")
    for candidate, dotted in ((f"{path}/__init__.py", f"{source}.__init__"), (f"{path}.py", source)):
        text = read(candidate)
        if text is not None:
            tree = ast.parse(text)
            try:
                return set(all_names(tree, candidate))
            except ValueError:
                return top_level_names(tree, package, dotted, read)
    raise ValueError(f"from {source} import *: neither {path}/__init__.py nor {path}.py in the source")


def names_of(chip: str, text: str, read: Callable[[str], Optional[str]]) -> list:
    path, _, _, how = CHIPS[chip]
    tree = ast.parse(text)
    if how == "__all__":
        return all_names(tree, path)
    module = path[:-3].replace("/", ".")
    return sorted(top_level_names(tree, path.split("/")[0], module, read))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def from_wheel(chip: str, wheel: Path) -> tuple:
    path = CHIPS[chip][0]
    with zipfile.ZipFile(wheel) as archive:
        members = set(archive.namelist())
        data = archive.read(path)

        def read(member: str) -> Optional[str]:
            return archive.read(member).decode("utf-8") if member in members else None

        names = names_of(chip, data.decode("utf-8"), read)
    package, version = wheel.name.split("-")[:2]
    source = {"kind": "wheel", "package": package.replace("_", "-"), "version": version, "file": wheel.name,
              "file_sha256": _sha256(wheel.read_bytes()), "path": path, "sha256": _sha256(data)}
    return names, source


def from_repository(chip: str, checkout: Path, repository: str, ref: str) -> tuple:
    path = CHIPS[chip][0]

    def git(*args: str) -> bytes:
        return subprocess.run(["git", "-C", str(checkout), *args], check=True, capture_output=True).stdout

    commit = git("rev-parse", f"{ref}^{{commit}}").decode().strip()
    date = git("show", "-s", "--format=%cs", commit).decode().strip()

    def read(member: str) -> Optional[str]:
        try:
            return git("show", f"{commit}:{member}").decode("utf-8")
        except subprocess.CalledProcessError:
            return None

    data = git("show", f"{commit}:{path}")
    names = names_of(chip, data.decode("utf-8"), read)
    source = {"kind": "repository", "repository": repository, "ref": ref, "commit": commit, "date": date,
              "path": path, "sha256": _sha256(data)}
    return names, source


def table(chip: str, names: list, source: dict) -> dict:
    import torch

    _, module, device_module, how = CHIPS[chip]
    cuda = set(torch.cuda.__all__)
    unique = sorted(set(names))
    return {
        "schema": 1, "chip": chip, "module": module, "device_module": device_module,
        "source": {**source, "names_from": how},
        "torch_checked": torch.__version__.split("+")[0],
        "names": unique,
        "not_in_torch_cuda": sorted(set(unique) - cuda),
        "torch_cuda_missing": sorted(cuda - set(unique)),
        "counts": {"names": len(unique), "duplicates": len(names) - len(unique),
                   "not_in_torch_cuda": len(set(unique) - cuda), "torch_cuda_missing": len(cuda - set(unique))},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chip", choices=sorted(CHIPS))
    parser.add_argument("source", type=Path, help="the wheel (ascend) or a git checkout of the repository")
    parser.add_argument("--repository", help="owner/name of the repository (repository sources)")
    parser.add_argument("--ref", help="branch, tag or commit to read (repository sources)")
    parser.add_argument("--out", type=Path, help="output file (default: the package's data folder)")
    args = parser.parse_args(argv)
    if args.source.suffix == ".whl":
        names, source = from_wheel(args.chip, args.source)
    else:
        if not (args.repository and args.ref):
            parser.error("a repository source needs --repository and --ref")
        names, source = from_repository(args.chip, args.source, args.repository, args.ref)
    out = args.out or DATA_DIR / f"{args.chip}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table(args.chip, names, source), indent=2) + "\n", encoding="utf-8")
    print(f"{out}: {len(set(names))} names", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
