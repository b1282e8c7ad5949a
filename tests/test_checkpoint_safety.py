"""Checkpoints that lose nothing: ft.save replaces a path atomically (a writer killed mid-write or
failing mid-write leaves the previous file loadable and its temporary is cleaned up), streams to
file objects that can neither seek nor read, and ft.checkpoint_info / ft.load name a file that is
not a sound checkpoint and say what it holds."""
from __future__ import annotations

import io
import os
import select
import signal
import stat
import subprocess
import sys
import zipfile

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl import atomic_file
from tests.helpers import ROOT, clean_env

MiB = 2 ** 20

# Saves 128 MiB over argv[1] and stops for good after argv[2] bytes reached the temporary: the
# real ft.save with its stream's write paused, so the parent can act while the write is half done.
PAUSED_WRITER = r"""
import sys, time, torch
import flagos_torchfl as ft
from flagos_torchfl import checkpoint

path, pause_at = sys.argv[1], int(sys.argv[2])
write, written = checkpoint._CommentedArchive.write, [0]

def pausing_write(self, data):
    count = write(self, data)
    written[0] += count
    if written[0] >= pause_at:
        self.flush()
        print("paused", flush=True)
        time.sleep(600)
    return count

checkpoint._CommentedArchive.write = pausing_write
ft.save({f"w{i}": torch.full((4 * 2**20,), float(i)) for i in range(8)}, path)
"""


def start_paused_writer(path):
    proc = subprocess.Popen([sys.executable, "-c", PAUSED_WRITER, str(path), str(64 * MiB)],
                            env=clean_env({"PYTHONPATH": str(ROOT / "src")}), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT)
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "paused":
        proc.kill()
        pytest.fail(f"the writer did not reach the middle of its write: {proc.communicate()[1][-3000:]}")
    return proc


def kill(proc):
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL


def temporaries(path):
    return atomic_file.temporaries(str(path.parent), path.name)


def test_a_writer_killed_mid_write_leaves_the_previous_checkpoint_loadable(tmp_path):
    path = tmp_path / "ckpt.pt"
    old = {"w": torch.arange(10.0), "step": 1}
    ft.save(old, path)
    before = path.read_bytes()
    proc = start_paused_writer(path)
    try:
        [temporary] = temporaries(path)
        assert (tmp_path / temporary).stat().st_size >= 64 * MiB  # half the new checkpoint is on disk
    finally:
        kill(proc)
    assert path.read_bytes() == before
    loaded = torch.load(path)  # plain torch
    assert torch.equal(loaded["w"], old["w"]) and loaded["step"] == 1
    assert temporaries(path) == [temporary]  # SIGKILL cannot clean up ...
    ft.save({"step": 2}, path)
    assert temporaries(path) == []  # ... the next save does
    assert torch.load(path) == {"step": 2}


def test_a_save_next_to_a_live_writer_leaves_its_temporary_alone(tmp_path):
    path = tmp_path / "ckpt.pt"
    proc = start_paused_writer(path)
    try:
        [theirs] = temporaries(path)
        ft.save({"step": 3}, path)
        assert temporaries(path) == [theirs] and torch.load(path) == {"step": 3}
    finally:
        kill(proc)


# Writes the previous checkpoint, then limits the size of any file this process writes to 8 MiB
# (RLIMIT_FSIZE: a write beyond it fails with EFBIG, as on a full disk) and saves 16 MiB over it.
FULL_DISK = r"""
import resource, shutil, signal, sys, torch
import flagos_torchfl as ft

path, copy = sys.argv[1], sys.argv[2]
ft.save({"step": 1}, path)
shutil.copy(path, copy)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (8 * 2**20, resource.RLIM_INFINITY))
big = {"w": torch.ones(4 * 2**20)}
try:
    ft.save(big, path)
except OSError as error:
    print("ft.save", error.errno)
try:
    torch.save(big, copy)
except Exception as error:
    print("torch.save", type(error).__name__)
"""


def test_a_write_failing_mid_checkpoint_leaves_the_previous_file_and_no_temporary(tmp_path):
    path, copy = tmp_path / "ckpt.pt", tmp_path / "copy.pt"
    proc = subprocess.run([sys.executable, "-c", FULL_DISK, str(path), str(copy)], capture_output=True,
                          text=True, timeout=120, env=clean_env({"PYTHONPATH": str(ROOT / "src")}), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == f"ft.save {__import__('errno').EFBIG}", proc.stdout
    assert torch.load(path) == {"step": 1} and temporaries(path) == []
    # the same fault under plain torch.save destroys the previous checkpoint
    assert lines[1].startswith("torch.save")
    with pytest.raises(Exception):
        torch.load(copy)


class _FailsToPickle:
    def __reduce__(self):
        raise RuntimeError("cannot pickle this")


def test_an_object_that_fails_to_pickle_leaves_the_previous_file_and_no_temporary(tmp_path):
    path = tmp_path / "ckpt.pt"
    ft.save({"step": 1}, path)
    before = path.read_bytes()
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        ft.save({"w": torch.ones(3), "bad": _FailsToPickle()}, path)
    assert path.read_bytes() == before and temporaries(path) == []
    fresh = tmp_path / "fresh.pt"
    with pytest.raises(RuntimeError, match="cannot pickle this"):
        ft.save({"bad": _FailsToPickle()}, fresh)
    assert not fresh.exists() and temporaries(fresh) == []


def test_the_replaced_file_keeps_its_mode_and_a_symlink_stays_a_symlink(tmp_path):
    real = tmp_path / "real.pt"
    ft.save({"step": 1}, real)
    real.chmod(0o640)
    link = tmp_path / "link.pt"
    link.symlink_to(real)
    ft.save({"step": 2}, link)
    assert link.is_symlink() and torch.load(real) == {"step": 2}
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    umask = os.umask(0o022)
    os.umask(umask)
    fresh = tmp_path / "fresh.pt"
    ft.save({"step": 3}, fresh)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # as open(path, "wb") creates it


def test_a_target_that_is_not_a_regular_file_is_written_as_torch_save_writes_it(tmp_path):
    ft.save({"step": 1}, os.devnull)
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    with pytest.raises(IsADirectoryError):
        ft.save({"step": 1}, tmp_path)
    assert list(tmp_path.iterdir()) == []


class _WriteOnly:
    """A sink that can neither seek nor read (a pipe, a socket, an upload stream)."""

    def __init__(self):
        self.chunks = []

    def write(self, data):
        self.chunks.append(bytes(data))
        return len(data)

    def flush(self):
        pass


def test_a_file_object_that_cannot_seek_or_read_gets_the_whole_checkpoint(tmp_path):
    obj = {"w": torch.randn(1000), "step": 5}
    sink = _WriteOnly()
    ft.save(obj, sink)
    data = io.BytesIO(b"".join(sink.chunks))
    # the storage's 4000 bytes went through in one write but its last 22 (held until the end record)
    assert max(map(len, sink.chunks)) == 4000 - 22
    loaded = torch.load(data)
    assert torch.equal(loaded["w"], obj["w"]) and loaded["step"] == 5
    data.seek(0)
    assert ft.checkpoint_info(data)["devices"] == ["cpu"] and data.tell() == 0
    with open(tmp_path / "opened.pt", "wb") as opened:  # write-only file object
        ft.save(obj, opened)
    assert torch.load(tmp_path / "opened.pt")["step"] == 5
    assert ft.checkpoint_info(tmp_path / "opened.pt")["device_type"] == "cpu"


def test_the_legacy_format_is_written_as_torch_writes_it_without_a_record(tmp_path):
    path = tmp_path / "legacy.pt"
    ft.save({"w": torch.ones(2), "step": 1}, path, _use_new_zipfile_serialization=False)
    assert not zipfile.is_zipfile(path)
    assert torch.load(path)["step"] == 1 and ft.load(path)["step"] == 1
    assert ft.checkpoint_info(path) is None


def saved(tmp_path):
    path = tmp_path / "good.pt"
    ft.save({"w": torch.arange(100.0), "step": 1}, path)
    return path.read_bytes()


BAD_FILES = {
    "empty": (lambda good: b"", r"is empty \(0 bytes\): not a torch checkpoint"),
    "random bytes": (lambda good: bytes(range(256)) * 8,
                     r"is not a torch checkpoint: its 2048 bytes start with b'\\x00\\x01.*zip archive"),
    "truncated": (lambda good: good[:len(good) // 2],
                  r"is a truncated torch checkpoint \(\d+ bytes\): .*end record is missing"),
    "cut in its record": (lambda good: good[:-10], r"has a damaged device record"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_checkpoint_info_and_load_name_a_bad_file_and_what_it_holds(tmp_path, case):
    make, message = BAD_FILES[case]
    path = tmp_path / "bad.pt"
    path.write_bytes(make(saved(tmp_path)))
    with pytest.raises(ft.CheckpointError, match=f"'{path}' {message}"):
        ft.checkpoint_info(path)
    if case == "cut in its record":  # every byte torch needs is there
        assert torch.load(path)["step"] == 1 and ft.load(path)["step"] == 1
        return
    with pytest.raises(ft.CheckpointError, match=f"'{path}' {message}") as raised:
        ft.load(path)
    assert raised.value.__cause__ is not None  # torch's own error, chained
    with open(path, "rb") as opened:
        with pytest.raises(ft.CheckpointError, match=f"'{path}' {message}"):
            ft.checkpoint_info(opened)


def test_a_zip_that_is_no_torch_checkpoint_and_a_directory_are_named(tmp_path):
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("notes.txt", "hello")
    for call in (ft.checkpoint_info, ft.load):
        with pytest.raises(ft.CheckpointError, match="is a zip archive but not a torch checkpoint: "
                                                     r"it has no data.pkl \(found notes.txt\)"):
            call(other)
    (tmp_path / "dcp").mkdir()
    (tmp_path / "dcp" / ".metadata").write_bytes(b"")
    for call in (ft.checkpoint_info, ft.load):
        with pytest.raises(ft.CheckpointError, match=f"'{tmp_path}' is a directory, not a torch "
                                                     r"checkpoint file$"):
            call(tmp_path)
        with pytest.raises(ft.CheckpointError, match="torch.distributed.checkpoint wrote it"):
            call(tmp_path / "dcp")


def corrupt(good, entry, at):
    """``good`` with 4 bytes of ``entry`` overwritten: ``at="header"`` its local header's
    signature, ``at="data"`` bytes inside its data."""
    info = zipfile.ZipFile(io.BytesIO(good)).getinfo(entry)
    data = bytearray(good)
    offset = info.header_offset
    if at == "data":
        name_length, extra_length = int.from_bytes(data[offset + 26:offset + 28], "little"), \
            int.from_bytes(data[offset + 28:offset + 30], "little")
        offset += 30 + name_length + extra_length + 20
    data[offset:offset + 4] = b"\xff\xfe\xfd\xfc"
    return bytes(data)


@pytest.mark.parametrize("entry, at, found", [
    ("archive/data.pkl", "data", "Bad CRC-32"), ("archive/data/0", "header", "Bad magic number"),
])
def test_ft_load_of_a_damaged_entry_names_the_file_and_the_entry(tmp_path, entry, at, found):
    path = tmp_path / "damaged.pt"
    path.write_bytes(corrupt(saved(tmp_path), entry, at))
    with pytest.raises(Exception) as plain:
        torch.load(path)
    assert not isinstance(plain.value, ft.CheckpointError)
    with pytest.raises(ft.CheckpointError, match=f"'{path}' is a damaged torch checkpoint: its entry "
                                                 f"'{entry}' is unreadable .*{found}") as raised:
        ft.load(path)
    assert type(raised.value.__cause__) is type(plain.value)


def test_a_refused_pickle_or_a_missing_file_stay_torchs_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        ft.load(tmp_path / "missing.pt")
    with pytest.raises(FileNotFoundError):
        ft.checkpoint_info(tmp_path / "missing.pt")
    buffer = io.BytesIO()
    ft.save({"payload": _Code()}, buffer)
    buffer.seek(0)
    with pytest.raises(Exception, match="Weights only load failed") as raised:
        ft.load(buffer, weights_only=True)  # torch's default before 2.6 loads it
    assert not isinstance(raised.value, ft.CheckpointError)


class _Code:
    def __reduce__(self):
        return (os.getcwd, ())


# A CUDA-written script: a transformers GPT-2 (random weights, tied embeddings) on "cuda", saved
# with ft.save over an older checkpoint and loaded back with ft.load.
SAVE_A_MODEL = r"""
import os, sys, torch, transformers
import flagos_torchfl as ft

path = sys.argv[1]
config = transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=16)
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(config).cuda()
ft.save({"step": 0}, path)
ft.save({"model": model.state_dict(), "step": 1}, path)
loaded = ft.load(path)
state = loaded["model"]
same = all(torch.equal(state[k].cpu(), v.cpu()) for k, v in model.state_dict().items())
tied = state["lm_head.weight"].untyped_storage().data_ptr() == state["transformer.wte.weight"].untyped_storage().data_ptr()
record = ft.checkpoint_info(path)
print(record["device_type"], record["devices"], state["lm_head.weight"].device, loaded["step"], same, tied,
      os.listdir(os.path.dirname(path)))
"""


@pytest.mark.parametrize("backend, device", [("cpu", "cpu"),
                                             pytest.param("sim", "sim:0", marks=pytest.mark.needs_sim)])
def test_a_model_saved_from_cuda_code_round_trips_on_cpu_and_sim(tmp_path, backend, device):
    path = tmp_path / "model.pt"
    proc = subprocess.run([sys.executable, "-m", "flagos_torchfl", "run", "--", sys.executable, "-c",
                           SAVE_A_MODEL, str(path)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=clean_env({"FL_BACKEND": backend, "PYTHONPATH": str(ROOT / "src")}))
    assert proc.returncode == 0, proc.stderr[-3000:]
    device_type = device.split(":")[0]
    assert proc.stdout.splitlines()[-1] == f"{device_type} ['{device}'] {device} 1 True True ['model.pt']"


def test_a_temporary_name_in_use_is_skipped(tmp_path, monkeypatch):
    import fcntl
    import secrets

    path = tmp_path / "ckpt.pt"
    taken = tmp_path / ".ckpt.pt.00000000.tmp"
    taken.write_bytes(b"another writer's half checkpoint")
    names = iter(["00000000", "11111111"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(names))
    with open(taken, "r+b") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # its writer is alive
        ft.save({"step": 1}, path)
        assert torch.load(path) == {"step": 1} and temporaries(path) == [taken.name]
    monkeypatch.undo()
    ft.save({"step": 2}, path)  # its writer is gone now
    assert temporaries(path) == [] and torch.load(path) == {"step": 2}


REMOVE_ABANDONED = "import sys; from flagos_torchfl import atomic_file; atomic_file.remove_abandoned(*sys.argv[1:])"


def test_a_temporary_removed_before_its_writer_locked_it_is_made_again(tmp_path, monkeypatch):
    import fcntl

    path = tmp_path / "ckpt.pt"
    flock, blocking_locks = fcntl.flock, []

    def flock_after_another_save_cleaned_up(fd, operation):
        if operation == fcntl.LOCK_EX:  # the writer, right after creating its temporary
            blocking_locks.append(os.readlink(f"/proc/self/fd/{fd}"))
            if len(blocking_locks) == 1:  # another process saving the same path gets there first
                subprocess.run([sys.executable, "-c", REMOVE_ABANDONED, str(tmp_path), path.name], check=True,
                               env=clean_env({"PYTHONPATH": str(ROOT / "src")}), timeout=120)
        return flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", flock_after_another_save_cleaned_up)
    ft.save({"step": 1}, path)
    first, second = blocking_locks  # the first temporary was removed under it: a second one was made
    assert first != second and not os.path.exists(first)
    assert torch.load(path) == {"step": 1} and temporaries(path) == []


@pytest.mark.parametrize("code", ["EINVAL", "ENOTSUP", "EOPNOTSUPP", "EBADF"])
def test_a_directory_that_cannot_be_fsynced_does_not_fail_the_save(tmp_path, monkeypatch, code):
    import errno

    real_fsync = os.fsync

    def fsync(fd):  # fault injected: the filesystem refuses fsync on directories only
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "ckpt.pt"
    ft.save({"w": torch.arange(3)}, str(path))
    assert torch.load(path)["w"].tolist() == [0, 1, 2]
    assert atomic_file.temporaries(str(tmp_path), "ckpt.pt") == []
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error"))
                        if stat.S_ISDIR(os.fstat(fd).st_mode) else real_fsync(fd))
    with pytest.raises(OSError, match="I/O error"):  # a real failure still fails the save
        ft.save({"w": torch.arange(3)}, str(path))


@pytest.mark.parametrize("code", ["ENOLCK", "EOPNOTSUPP"])
def test_a_filesystem_without_locks_is_written_without_one(tmp_path, monkeypatch, code):
    import errno
    import fcntl

    def flock(fd, operation):  # fault injected: the filesystem has no file locks
        raise OSError(getattr(errno, code), os.strerror(getattr(errno, code)))

    path = tmp_path / "ckpt.pt"
    ft.save({"w": torch.zeros(2)}, str(path))
    (tmp_path / ".ckpt.pt.0123abcd.tmp").write_bytes(b"left by a killed writer")
    monkeypatch.setattr(fcntl, "flock", flock)
    ft.save({"w": torch.ones(2)}, str(path))
    assert torch.load(path)["w"].tolist() == [1.0, 1.0]
    # whether that temporary's writer is alive cannot be told without locks: it is left alone
    assert atomic_file.temporaries(str(tmp_path), "ckpt.pt") == [".ckpt.pt.0123abcd.tmp"]
