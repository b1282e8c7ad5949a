"""Checkpoints that move between chips: :func:`save` writes what ``torch.save`` writes plus one
extra record in the zip archive, ``<archive>/.data/flagos_torchfl.json``, holding where it was
written (backend, device type, the devices of its tensors, torch and package versions). Plain
``torch.load`` ignores the record and returns exactly the saved object; :func:`info` reads it.

:func:`load` loads on whatever this process runs: under an active backend the storages' location
tags are translated by the redirection (``"cuda:N"``, or another chip's ``"npu:N"`` when that
chip's runtime is not here, land on the logical device ``N``); with no backend active, tags of a
device type this process cannot restore land on the CPU. ``weights_only`` stays torch's default,
so a pickle carrying code is refused as by ``torch.load``.
"""
from __future__ import annotations

import io
import json
import os
import zipfile
from typing import Any, Dict, Optional

import torch

RECORD = "flagos_torchfl.json"
FORMAT = 1


def save(obj: Any, f: Any, **kwargs: Any) -> None:
    """``torch.save(obj, f, **kwargs)`` plus the device record. ``f``: a path or a writable
    binary file object. The archive is built in memory first (the zip record is appended to it)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer, **kwargs)
    data = append_record(buffer.getvalue(), metadata(obj))
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as out:
            out.write(data)
    else:
        f.write(data)


def metadata(obj: Any) -> Dict[str, Any]:
    """The record :func:`save` writes for ``obj`` in this process."""
    from . import __version__
    from .api import current_backend

    selection = current_backend()
    return {
        "format": FORMAT,
        "backend": selection.backend if selection is not None else None,
        "device_type": selection.chip.device_type if selection is not None else "cpu",
        "devices": sorted({str(t.device) for t in _tensors(obj)}),
        "torch": torch.__version__,
        "flagos_torchfl": __version__,
    }


def append_record(archive: bytes, record: Dict[str, Any]) -> bytes:
    """``archive`` (what ``torch.save`` wrote) with ``record`` added as the device record."""
    buffer = io.BytesIO(archive)
    with zipfile.ZipFile(buffer, "a") as zf:
        prefix = zf.namelist()[0].split("/")[0]
        zf.writestr(f"{prefix}/.data/{RECORD}", json.dumps(record, sort_keys=True))
    return buffer.getvalue()


def info(f: Any) -> Optional[Dict[str, Any]]:
    """The device record of checkpoint ``f`` (path or seekable binary file object, left at its
    position), or None when it has none (plain ``torch.save``, or the legacy format)."""
    opened = f if not isinstance(f, (str, os.PathLike)) else open(f, "rb")
    position = opened.tell()
    try:
        if not zipfile.is_zipfile(opened):
            return None
        opened.seek(position)
        with zipfile.ZipFile(opened) as zf:
            names = [n for n in zf.namelist() if n.endswith(f"/.data/{RECORD}")]
            return json.loads(zf.read(names[0])) if names else None
    finally:
        if opened is f:
            f.seek(position)
        else:
            opened.close()


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load(f, map_location, **kwargs)`` that places every storage on a device of this
    process when ``map_location`` is None (see the module's docstring)."""
    from .api import current_backend

    if map_location is None and current_backend() is None:
        map_location = _restorable_here
    return torch.load(f, map_location=map_location, **kwargs)


def _restorable_here(storage: Any, location: str) -> Any:
    device_type = location.partition(":")[0]
    module = getattr(torch, device_type, None)
    if device_type == "cpu" or (module is not None and getattr(module, "is_available", lambda: False)()):
        return None  # torch restores it where it was
    return storage  # the CPU storage torch handed in


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
