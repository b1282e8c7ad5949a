"""What a file given as a checkpoint holds: :func:`archive` opens torch's zip archive in it or
raises :class:`CheckpointError` naming the file and what was found instead (a directory, no
bytes, bytes of another kind, an archive cut short or without torch's ``data.pkl``);
:func:`fault` also checks every entry, for the error :func:`flagos_torchfl.load` raises when
``torch.load`` fails on a damaged file."""
from __future__ import annotations

import contextlib
import os
import pickle
import zipfile
from typing import Any, BinaryIO, Iterator, Optional, Tuple

import torch

from .errors import CheckpointError

END_RECORD = 22  # a zip's end-of-central-directory record without its comment
END_SIGNATURE = b"PK\x05\x06"
ZIP_SIGNATURE = b"PK\x03\x04"
#: how torch's legacy format (``_use_new_zipfile_serialization=False``) starts, per pickle protocol
LEGACY_STARTS = tuple(pickle.dumps(torch.serialization.MAGIC_NUMBER, protocol=p)
                      for p in range(2, pickle.HIGHEST_PROTOCOL + 1))


@contextlib.contextmanager
def reading(f: Any) -> Iterator[Tuple[BinaryIO, str]]:
    """``f`` open for reading and its name for messages; a file object is left at its position."""
    if not isinstance(f, (str, os.PathLike)):
        position = f.tell()
        try:
            name = getattr(f, "name", None)
            yield f, repr(name) if isinstance(name, str) else f"<{type(f).__name__} object>"
        finally:
            f.seek(position)
        return
    name = repr(os.fspath(f))
    if os.path.isdir(f):
        dcp = os.path.exists(os.path.join(f, ".metadata"))
        raise CheckpointError(f"{name} is a directory, not a torch checkpoint file" + (
            "; its .metadata says torch.distributed.checkpoint wrote it: read it with "
            "torch.distributed.checkpoint.load" if dcp else ""))
    with open(f, "rb") as stream:
        yield stream, name


def archive(stream: BinaryIO, name: str) -> Optional[zipfile.ZipFile]:
    """The zip archive of the checkpoint in ``stream`` (None for torch's legacy format), or
    :class:`CheckpointError` saying what ``stream`` holds instead."""
    start = stream.tell()
    head = stream.read(64)
    size = stream.seek(0, os.SEEK_END) - start
    stream.seek(start)
    if size == 0:
        raise CheckpointError(f"{name} is empty (0 bytes): not a torch checkpoint")
    if head.startswith(LEGACY_STARTS):
        return None
    if not head.startswith(ZIP_SIGNATURE):
        raise CheckpointError(
            f"{name} is not a torch checkpoint: its {size} bytes start with {head[:8]!r}, while "
            f"torch.save writes a zip archive (starting {ZIP_SIGNATURE!r}) or, in its legacy "
            f"format, a pickle (starting {LEGACY_STARTS[0][:4]!r})")
    try:
        zf = zipfile.ZipFile(stream)
    except zipfile.BadZipFile as error:
        stream.seek(max(start, start + size - 65536 - END_RECORD))
        cut = END_SIGNATURE not in stream.read()
        raise CheckpointError(
            f"{name} is a truncated torch checkpoint ({size} bytes): it starts as a zip archive "
            "but its end record is missing, as when a write is interrupted" if cut else
            f"{name} is a damaged torch checkpoint ({size} bytes): its zip directory is "
            f"unreadable ({error})") from error
    if not any(n.endswith("/data.pkl") or n == "data.pkl" for n in zf.namelist()):
        found = ", ".join(zf.namelist()[:5]) or "no entries"
        raise CheckpointError(f"{name} is a zip archive but not a torch checkpoint: it has no "
                              f"data.pkl (found {found})")
    return zf


def position(f: Any) -> Optional[int]:
    """Where file object ``f`` stands (None for a path, or a stream that cannot tell)."""
    if isinstance(f, (str, os.PathLike)):
        return None
    with contextlib.suppress(Exception):
        return f.tell()
    return None


def fault(f: Any, position: Optional[int]) -> Optional[CheckpointError]:
    """What is wrong with checkpoint file ``f`` (a file object read from ``position``), or None
    when it looks sound or cannot be read again. Checks the archive's directory, every entry's
    header, and the checksums of every entry but the storages' bytes."""
    if not isinstance(f, (str, os.PathLike)):
        if position is None:
            return None
        f.seek(position)
    try:
        with reading(f) as (stream, name):
            found = archive(stream, name)
            return None if found is None else _damaged_entry(found, name)
    except CheckpointError as found_fault:
        return found_fault
    except OSError:  # missing, unreadable: torch's error says so
        return None


def _damaged_entry(zf: zipfile.ZipFile, name: str) -> Optional[CheckpointError]:
    """The first entry of ``zf`` whose header (or, but for storages, checksum) is wrong."""
    for entry in zf.infolist():
        parts = entry.filename.split("/")
        storage = len(parts) == 3 and parts[1] == "data"  # <archive>/data/<key>: tensor bytes
        try:
            with zf.open(entry) as opened:
                if not storage:
                    opened.read()
        except (zipfile.BadZipFile, EOFError, OSError, ValueError) as error:
            return CheckpointError(f"{name} is a damaged torch checkpoint: its entry "
                                   f"{entry.filename!r} is unreadable ({error})")
    return None
