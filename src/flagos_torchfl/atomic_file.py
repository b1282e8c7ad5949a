"""Files replaced whole or not at all. :func:`replaced` hands out a temporary file next to the
target; when the caller's block ends without an exception the temporary is flushed, fsynced and
renamed over the target (``os.replace``), then the directory is fsynced so the rename itself
survives a crash. On any error the temporary is removed and the target is untouched; a process
killed mid-write (SIGKILL, power loss before the rename) leaves the target as it was plus its
temporary, which the next :func:`replaced` of the same target removes.

A temporary is ``.<target name>.<8 hex digits>.tmp``; its writer holds an exclusive ``flock`` on
it until the rename, so a temporary whose lock can be taken belongs to a writer that is gone, and
concurrent writers of one target never remove each other's. Where the filesystem has no such
locks (``flock`` fails with ENOLCK or EOPNOTSUPP: some NFS mounts) the temporary is written
without one. A directory fsync the filesystem does not support (EINVAL, ENOTSUP, EOPNOTSUPP,
EBADF) after the rename does not fail the save: the content itself was fsynced.

Replacing makes a new file: a hard link to the old one keeps the old content, the new file is
owned by the writer (the permission bits are kept), and the directory must be writable.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from typing import BinaryIO, Iterator, Tuple

from .log import get_logger

_TEMPORARY_TAIL = re.compile(r"[0-9a-f]{8}\.tmp")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: errors that say the filesystem has no such operation, not that the write failed
_NO_DIRECTORY_FSYNC = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF})
_NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP})
log = get_logger("atomic_file")


@contextlib.contextmanager
def replaced(path: "str | os.PathLike[str]") -> Iterator[BinaryIO]:
    """A binary file to write the new content of ``path`` to; the content replaces ``path``
    atomically when the block ends normally (see the module's docstring). A symlink is followed
    (the file it points to is replaced); the new file keeps the permission bits of the one it
    replaces. A target that exists and is not a regular file (``/dev/null``, a FIFO, a directory)
    cannot be renamed over: it is opened with ``"wb"`` as ``open`` would. Replacing breaks hard
    links to ``path``, gives the new file the writer's ownership and needs write permission on
    its directory."""
    target = os.path.realpath(path)
    if os.path.exists(target) and not stat.S_ISREG(os.stat(target).st_mode):
        with open(target, "wb") as out:
            yield out
        return
    directory, name = os.path.split(target)
    remove_abandoned(directory, name)
    fd, temporary = _create(directory, name)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.fchmod(fd, stat.S_IMODE(os.stat(target).st_mode))
        with os.fdopen(fd, "wb", closefd=False) as out:
            yield out
            out.flush()
            os.fsync(fd)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    finally:
        os.close(fd)  # releases the lock, after the rename
    _fsync_directory(directory)


def temporaries(directory: str, name: str) -> list:
    """The names of the temporaries of target ``name`` in ``directory`` (live or abandoned)."""
    prefix = f".{name}."
    return sorted(entry.name for entry in os.scandir(directory)
                  if entry.name.startswith(prefix) and _TEMPORARY_TAIL.fullmatch(entry.name[len(prefix):]))


def remove_abandoned(directory: str, name: str) -> None:
    """Remove the temporaries of target ``name`` whose writer is gone (their lock is free)."""
    import fcntl  # POSIX: imported here so that importing the package does not need it
    for temporary in temporaries(directory, name):
        path = os.path.join(directory, temporary)
        try:
            fd = os.open(path, os.O_RDWR | _CLOEXEC)
        except OSError:  # renamed or removed meanwhile, or another user's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live writer
        except OSError as exc:
            if exc.errno in _NO_LOCKS:  # no locks here: whose temporary it is cannot be told
                return
            raise
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        finally:
            os.close(fd)


def _create(directory: str, name: str) -> Tuple[int, str]:
    """A new locked temporary for target ``name``: (fd, path). Created with mode 0o666 so the
    umask applies as it does to ``open(path, "wb")``."""
    import fcntl
    while True:
        temporary = os.path.join(directory, f".{name}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o666)
        except FileExistsError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                os.close(fd)
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(temporary)
                raise
            log.debug("%s: no file locks on this filesystem (%s); writing without one", temporary, exc)
        # between creation and locking another writer's remove_abandoned may have taken it
        with contextlib.suppress(FileNotFoundError):
            if os.path.samestat(os.fstat(fd), os.stat(temporary)):
                return fd, temporary
        os.close(fd)


def _fsync_directory(directory: str) -> None:
    """Make the rename durable; a filesystem that cannot fsync a directory is let be."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_DIRECTORY_FSYNC:
            raise
        log.debug("%s: the directory cannot be fsynced here (%s)", directory, exc)
    finally:
        os.close(fd)
