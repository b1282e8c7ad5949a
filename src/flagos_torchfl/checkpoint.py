"""Checkpoints that move between chips: :func:`save` writes what ``torch.save`` writes plus a
device record: where it was written (backend, device type, the devices of its tensors, torch and
package versions), as the zip archive's comment (``flagos_torchfl.json`` and a line of JSON).
Checkpoints of earlier versions carry it as the entry ``<archive>/.data/flagos_torchfl.json``; both
are read. Plain ``torch.load`` ignores the record and returns exactly the saved object; :func:`info`
reads it.

:func:`save` streams: every byte ``torch.save`` produces goes straight to the file except the
archive's last 22 (its end record), which are written with the record as their comment, so it
holds no more memory than ``torch.save``. Saving to a path replaces the file atomically
(:mod:`.atomic_file`): a crash or a kill mid-write leaves the previous checkpoint intact.

:func:`load` loads on whatever this process runs: under an active backend the storages' location
tags are translated by the redirection (``"cuda:N"``, or another chip's ``"npu:N"`` when that
chip's runtime is not here, land on the logical device ``N``); with no backend active, tags of a
device type this process cannot restore land on the CPU. ``weights_only`` stays torch's default,
so a pickle carrying code is refused as by ``torch.load``. A file that is not a sound checkpoint
(empty, cut short, not a torch archive, a damaged entry) raises :class:`CheckpointError` naming it,
for :func:`load` and :func:`info` alike.
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import Any, BinaryIO, Dict, Optional

import torch

from . import active, atomic_file, checkpoint_files as files
from .checkpoint_files import END_RECORD, END_SIGNATURE
from .errors import CheckpointError
from .version import __version__

RECORD = "flagos_torchfl.json"
FORMAT = 1
#: the archive comment holding the record starts with this line
COMMENT_TAG = RECORD.encode() + b"\n"


def save(obj: Any, f: Any, **kwargs: Any) -> None:
    """``torch.save(obj, f, **kwargs)`` plus the device record, streamed (no copy of the archive
    is held in memory).

    ``f`` a path: the checkpoint is written to a temporary file in the same directory, fsynced and
    renamed over ``f``; on any error (or a kill) ``f`` is left as it was and the temporary is
    removed (a killed writer's by the next save of ``f``). ``f`` a writable binary file object:
    written at its position as ``torch.save`` does; no rename is possible there, so an error
    mid-write leaves it partly written. With ``_use_new_zipfile_serialization=False`` torch writes
    its legacy format, which has no place for the record: the file is what ``torch.save`` writes.
    """
    comment = COMMENT_TAG + json.dumps(metadata(obj), sort_keys=True).encode()
    if isinstance(f, (str, os.PathLike)):
        with atomic_file.replaced(f) as out:
            _write(obj, out, comment, kwargs)
    else:
        _write(obj, f, comment, kwargs)


def _write(obj: Any, out: BinaryIO, comment: bytes, kwargs: Dict[str, Any]) -> None:
    if not kwargs.get("_use_new_zipfile_serialization", True):
        torch.save(obj, out, **kwargs)
        return
    stream = _CommentedArchive(out)
    try:
        torch.save(obj, stream, **kwargs)
    except Exception:
        if stream.failure is None:
            raise
        # torch then fails to finish the archive on its way out; the write's error is the cause
        raise stream.failure from None
    stream.close(comment)


class _CommentedArchive:
    """What ``torch.save`` writes to: passes every byte to ``out`` at once except the last 22 seen,
    which :meth:`close` writes as the zip's end record with ``comment``. No ``fileno``, so torch
    writes through :meth:`write` only; ``failure`` is the first error a write to ``out`` raised."""

    def __init__(self, out: BinaryIO):
        self._out, self._tail, self.failure = out, b"", None

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        try:
            self._pass(view)
        except Exception as error:
            self.failure = self.failure or error
            raise
        return len(view)

    def _pass(self, view: memoryview) -> None:
        if len(view) >= END_RECORD:
            self._out.write(self._tail)
            self._out.write(view[:-END_RECORD])
            self._tail = bytes(view[-END_RECORD:])
        else:
            joined = self._tail + bytes(view)
            self._out.write(joined[:-END_RECORD])
            self._tail = joined[-END_RECORD:]

    def flush(self) -> None:
        self._out.flush()

    def close(self, comment: bytes) -> None:
        tail = self._tail
        if len(tail) != END_RECORD or not tail.startswith(END_SIGNATURE) or tail[-2:] != b"\0\0":
            raise CheckpointError(f"torch.save ended its archive with {tail!r}, not a zip end record "
                                  "without comment: this torch writes a format ft.save does not know")
        self._out.write(tail[:-2] + len(comment).to_bytes(2, "little") + comment)
        self._out.flush()


def metadata(obj: Any) -> Dict[str, Any]:
    """The record :func:`save` writes for ``obj`` in this process."""
    selection = active.current()
    return {
        "format": FORMAT,
        "backend": selection.backend if selection is not None else None,
        "device_type": selection.chip.device_type if selection is not None else "cpu",
        "devices": sorted({str(t.device) for t in _tensors(obj)}),
        "torch": torch.__version__,
        "flagos_torchfl": __version__,
    }


def info(f: Any) -> Optional[Dict[str, Any]]:
    """The device record of checkpoint ``f`` (a path, or a seekable binary file object, left at its
    position); None for a torch checkpoint without one (plain ``torch.save``, or torch's legacy
    format). Anything else (a directory, an empty file, a cut-short archive, bytes that are no
    torch checkpoint) raises :class:`CheckpointError` naming ``f`` and what it holds."""
    with files.reading(f) as (stream, name):
        archive = files.archive(stream, name)
        return None if archive is None else _record(archive, name)


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load(f, map_location, **kwargs)`` that places every storage on a device of this
    process when ``map_location`` is None (see the module's docstring). When torch fails on a file
    that is not a sound checkpoint, raises :class:`CheckpointError` naming the file and its fault
    (torch's exception chained); any other failure (a refused pickle, an unknown device) is
    torch's own."""
    if map_location is None and active.current() is None:
        map_location = _restorable_here
    position = files.position(f)
    try:
        return torch.load(f, map_location=map_location, **kwargs)
    except Exception as error:
        fault = files.fault(f, position)
        if fault is None:
            raise
        raise fault from error


def _record(archive: zipfile.ZipFile, name: str) -> Optional[Dict[str, Any]]:
    if archive.comment.startswith(COMMENT_TAG):
        text = archive.comment[len(COMMENT_TAG):]
    else:
        names = [n for n in archive.namelist() if n.endswith(f"/.data/{RECORD}")]
        if not names:
            return None
        text = archive.read(names[0])
    try:
        return json.loads(text)
    except ValueError as error:
        raise CheckpointError(f"{name} has a damaged device record ({error}: {text[-40:]!r}); "
                              "a file cut short at its very end looks like this") from error


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
