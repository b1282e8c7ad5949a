"""The sim's C++ runtime (``runtime.cpp`` and ``allocator.cpp`` beside this file): a device guard,
PrivateUse1 hooks and profiler stubs written in C++, the parts of an accelerator that PyTorch's
C++ side asks for and a Python backend cannot register (a Python-registered guard answers only the
device type); and the C++ route: the device's caching allocators (:mod:`.allocator`) and one
boxed C++ kernel for the native operators, which runs each operator's CPU kernel on the sim
tensors' memory without entering Python.

It is built at first use with the machine's C++ compiler (``$CXX``, else ``c++``, ``g++`` or
``clang++`` on ``PATH``) against the installed torch's and Python's headers, in about thirty seconds, and kept in a
cache folder keyed by the source, the torch build and the compiler (``$XDG_CACHE_HOME``, else
``~/.cache``, under ``flagos_torchfl/sim-cpp``; a temporary folder where that is not writable).
Processes that start at once build it once: the build holds a file lock and the result appears by
an atomic rename. ``pip install`` needs no compiler; without one the sim runs with its Python guard
(:func:`load` says why), which answers fewer of PyTorch's questions (``docs/design.md``).
"""
from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import allocator

SOURCES = tuple(Path(__file__).with_name(name) for name in ("runtime.cpp", "allocator.cpp", "allocator.h"))
"""The files the runtime is built from (the ``.cpp`` ones compiled, the header read by both)."""
ABI = 7
"""The interface version of ``runtime.cpp`` this loader speaks (``fl_sim_abi()``)."""

BUILD_TIMEOUT = 300.0
"""Seconds a build may take before it is abandoned."""

LIBRARY_NAME = "libflagos_sim_runtime.so"


def _device_graph(keep_graph: bool) -> object:
    """A new graph of the sim's device (its ``<TYPE>Graph``): what ``torch.accelerator.Graph``
    holds on the sim."""
    from .. import device, state

    return getattr(device, f"{state.DEVICE_TYPE.upper()}Graph")(keep_graph)


def _supported_dtype_names() -> list:
    """The dtypes a sim device holds, as C++ names them (asked at the first capability question)."""
    from .. import capability

    return capability.supported_dtype_names()


class CppUnavailable(RuntimeError):
    """The C++ runtime could not be built or loaded here; the message says why."""


class CppRuntime:
    """The loaded library: the calling thread's current device and streams, the devices' use,
    pinned memory. ``current_stream(device)`` and ``exchange_stream(device, id)`` read and set
    the calling thread's current stream id on a device (0: its default stream)."""

    def __init__(self, library: ctypes.CDLL, path: Path):
        self.path = path
        self._lib = library
        library.fl_sim_register.argtypes = [ctypes.c_int, ctypes.c_int]
        library.fl_sim_error.restype = ctypes.c_char_p
        library.fl_sim_set_device.argtypes = [ctypes.c_int]
        library.fl_sim_mark_used.argtypes = []
        library.fl_sim_is_pinned.argtypes = [ctypes.c_void_p]
        library.fl_sim_current_stream.argtypes = [ctypes.c_int]
        library.fl_sim_current_stream.restype = ctypes.c_int64
        library.fl_sim_exchange_stream.argtypes = [ctypes.c_int, ctypes.c_int64]
        library.fl_sim_exchange_stream.restype = ctypes.c_int64
        library.fl_sim_install_memory.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        allocator.declare(library)
        library.fl_sim_register_kernels.argtypes = [ctypes.c_char_p]
        library.fl_sim_set_fused_attention.argtypes = [ctypes.c_int]
        library.fl_sim_owns_block.argtypes = [ctypes.c_void_p]
        library.fl_sim_resize_storage.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
        self._py = ctypes.PyDLL(str(path))  # the entry points that take Python objects, GIL held
        library.fl_sim_count_calls.argtypes = [ctypes.c_int]
        library.fl_sim_count_calls.restype = None
        self._py.fl_sim_call_counts.restype = ctypes.py_object
        self._py.fl_sim_pause_counting.argtypes = [ctypes.c_int]  # PyDLL: the GIL stays held
        self._py.fl_sim_pause_counting.restype = None
        self._py.fl_sim_set_graphs.argtypes = [ctypes.py_object]
        self._py.fl_sim_set_dtypes.argtypes = [ctypes.py_object]
        self._py.fl_sim_set_first_use.argtypes = [ctypes.py_object]
        self.current_stream = library.fl_sim_current_stream
        self.exchange_stream = library.fl_sim_exchange_stream
        self.current_device = library.fl_sim_current_device
        self._set_device = library.fl_sim_set_device

    def register(self, devices: int, bfloat16: bool) -> None:
        """Register the guard, hooks and profiler stubs on PrivateUse1 for ``devices`` devices,
        the dtypes its capability lists (:mod:`..capability`, found at the first question) and, where torch has
        ``torch.accelerator.Graph`` (2.12 on), the device's graphs as its implementation.
        Raises :class:`CppUnavailable` when another backend's guard or hooks are there."""
        status = self._lib.fl_sim_register(devices, int(bool(bfloat16)))
        if status != 0:
            raise CppUnavailable(self._lib.fl_sim_error().decode(errors="replace"))
        self._py.fl_sim_set_dtypes(_supported_dtype_names)
        if self._py.fl_sim_set_graphs(_device_graph) == 2:
            raise CppUnavailable(self._lib.fl_sim_error().decode(errors="replace"))

    def new_allocator(self, index: int, limit: int | None = None,
                      device_name: Callable[[int], str] | None = None) -> allocator.CppCachingAllocator:
        """A new C++ caching allocator for device ``index`` (``limit``: bytes, None for the
        nominal capacity; ``device_name``: its name in errors)."""
        return allocator.CppCachingAllocator(self._lib, index, limit, device_name)

    def install_memory(self, allocators: Sequence[allocator.CppCachingAllocator]) -> None:
        """Make ``allocators`` (one per registered device, by index, from :meth:`new_allocator`)
        the device's memory in C++: the PrivateUse1 allocator, the pinned host allocator, and the
        CPU allocator through which native kernels' outputs are allocated as sim memory."""
        handles = (ctypes.c_void_p * len(allocators))(*(each.handle for each in allocators))
        if self._lib.fl_sim_install_memory(handles, len(allocators)) != 0:
            raise CppUnavailable(self._lib.fl_sim_error().decode(errors="replace"))

    def register_kernels(self, names) -> int:
        """Register the C++ route's C++ kernel on PrivateUse1 for each overload in ``names``
        (fully qualified); returns how many. Where ``names`` hold the host's fused attention
        (``FUSED_ATTENTION``), ``scaled_dot_product_attention`` chooses its kernel as the CPU
        does and runs the chosen one natively; else it runs its math composite."""
        count = self._lib.fl_sim_register_kernels("\n".join(sorted(names)).encode())
        if count < 0:
            raise CppUnavailable(self._lib.fl_sim_error().decode(errors="replace"))
        self._lib.fl_sim_set_fused_attention(int(FUSED_ATTENTION <= frozenset(names)))
        return count

    def count_calls(self, on: bool) -> None:
        """Count every C++ route kernel's calls and host time from now on, from zero (``on``), or
        stop counting (the counts stay readable)."""
        self._lib.fl_sim_count_calls(int(on))

    def pause_counting(self, paused: bool) -> None:
        """Whether the calling thread's C++ kernel calls go uncounted from now on."""
        self._py.fl_sim_pause_counting(int(paused))

    def call_counts(self) -> dict:
        """``{overload: (calls, nanoseconds)}`` of the C++ kernels counted (:meth:`count_calls`)."""
        return self._py.fl_sim_call_counts()

    def owns_block(self, storage) -> bool:
        """Whether sim ``storage`` holds its own block (not a slice of another storage)."""
        return bool(self._lib.fl_sim_owns_block(storage._cdata))

    def resize_storage(self, storage, nbytes: int) -> None:
        """Give sim ``storage`` a new block of ``nbytes`` bytes in place, keeping the leading
        bytes both sizes have; every tensor sharing it sees the new memory."""
        if self._lib.fl_sim_resize_storage(storage._cdata, nbytes, storage.device.index) != 0:
            message = self._lib.fl_sim_error().decode(errors="replace")
            if "out of memory" in message.lower():
                raise torch_oom(message)
            raise RuntimeError(message)

    def set_device(self, index: int) -> None:
        """Make ``index`` the calling thread's current device (checked by the caller)."""
        if self._set_device(index) != 0:
            raise RuntimeError(f"invalid device index {index}")

    def mark_used(self) -> None:
        """Record that the devices were used in this process (the hooks' primary context)."""
        self._lib.fl_sim_mark_used()

    def on_first_use(self, noted: Callable[[], None]) -> None:
        """Call ``noted()`` once, when the runtime itself (an allocation) uses the devices before
        Python did."""
        self._py.fl_sim_set_first_use(noted)

    def is_pinned(self, address: int) -> bool:
        """Whether ``address`` lies inside a block of the pinned host allocator."""
        return bool(self._lib.fl_sim_is_pinned(address))


#: the operators of the host's fused attention: its choice, the flash kernel and its backward
FUSED_ATTENTION = frozenset({"aten::_fused_sdp_choice", "aten::_scaled_dot_product_flash_attention_for_cpu",
                             "aten::_scaled_dot_product_flash_attention_for_cpu_backward"})


def torch_oom(message: str) -> Exception:
    import torch

    return torch.OutOfMemoryError(message)


def load(cache_dir: Optional[Path] = None, timeout: float = BUILD_TIMEOUT) -> CppRuntime:
    """The C++ runtime, built first if this torch and compiler have no build in the cache.
    Raises :class:`CppUnavailable` naming what is missing (no compiler, a failed or
    timed-out build, a library that does not load)."""
    import torch

    compiler = find_compiler()
    torch_dir = Path(torch.__file__).parent
    folder = (cache_dir or default_cache_dir()) / build_key(compiler, torch_dir, torch.__version__)
    library = folder / LIBRARY_NAME
    if not library.exists():
        import sysconfig  # only to build: imported at every start it costs more than loading

        headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
        if not headers.exists():
            raise CppUnavailable(f"Python's C headers are not installed ({headers} is missing; install the "
                                    "python3-dev package or its equivalent)")
        _build_locked(compiler, torch_dir, folder, library, timeout)
    try:
        lib = ctypes.CDLL(str(library))
    except OSError as exc:
        raise CppUnavailable(f"the sim's C++ runtime ({library}) does not load: {exc}") from exc
    if lib.fl_sim_abi() != ABI:
        raise CppUnavailable(f"{library} speaks interface {lib.fl_sim_abi()}, not {ABI}")
    return CppRuntime(lib, library)


def status(cache_dir: Optional[Path] = None) -> str:
    """One line for ``detect``, without building: where the built runtime is, or which compiler
    will build it at first use, or why the sim will run on its Python guard."""
    import torch

    try:
        compiler = find_compiler()
    except CppUnavailable as exc:
        return f"C++ runtime unavailable ({exc}): the sim will run on its Python guard"
    torch_dir = Path(torch.__file__).parent
    library = (cache_dir or default_cache_dir()) / build_key(compiler, torch_dir, torch.__version__) / LIBRARY_NAME
    if library.exists():
        return f"C++ runtime built: {library}"
    return f"C++ runtime: built at first use with {compiler} (about 10 s of CPU, once)"


def find_compiler() -> str:
    """The C++ compiler to build with: ``$CXX``, else the first of ``c++``, ``g++``,
    ``clang++`` on ``PATH``."""
    named = os.environ.get("CXX", "").strip()
    if named:
        found = shutil.which(named.split()[0])
        if found is None:
            raise CppUnavailable(f"CXX={named!r} names no program on PATH")
        return found
    for candidate in ("c++", "g++", "clang++"):
        found = shutil.which(candidate)
        if found:
            return found
    raise CppUnavailable("no C++ compiler found (set CXX, or install g++ or clang++)")


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME`` (else ``~/.cache``) ``/flagos_torchfl/sim-cpp``, or a folder in the
    temporary directory when that cannot be created."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    folder = Path(base) / "flagos_torchfl" / "sim-cpp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / f"flagos_torchfl-sim-cpp-{os.getuid()}"


def build_key(compiler: str, torch_dir: Path, torch_version: str) -> str:
    """The cache entry of one build: the source, the torch build it links and the compiler."""
    digest = hashlib.sha256()
    for source in SOURCES:
        digest.update(source.read_bytes() + b"\0")
    for part in (compiler, str(torch_dir), torch_version):
        digest.update(b"\0" + part.encode())
    return f"{torch_version.replace('+', '_')}-{digest.hexdigest()[:16]}"


def compile_command(compiler: str, torch_dir: Path, output: Path) -> list[str]:
    """The command that builds the runtime's sources into ``output`` against the torch in
    ``torch_dir``, with that build's C++ ABI."""
    import torch

    include = torch_dir / "include"
    lib = torch_dir / "lib"
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    import sysconfig

    python_include = sysconfig.get_paths()["include"]
    return [compiler, "-O2", "-std=c++20", "-fPIC", "-shared", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-I{include}", f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{python_include}",
            *(str(source) for source in SOURCES if source.suffix == ".cpp"),
            f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}", "-o", str(output)]


def _build_locked(compiler: str, torch_dir: Path, folder: Path, library: Path, timeout: float) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = open(folder / ".lock", "w")
    except OSError as exc:
        raise CppUnavailable(f"cannot write the build folder {folder}: {exc}") from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same entry
        if library.exists():
            return
        partial = folder / f".{LIBRARY_NAME}.{os.getpid()}.tmp"
        command = compile_command(compiler, torch_dir, partial)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            partial.unlink(missing_ok=True)
            raise CppUnavailable(f"building the sim's C++ runtime took over {timeout:.0f} s "
                                    f"({compiler})") from exc
        except OSError as exc:
            raise CppUnavailable(f"the C++ compiler {compiler} cannot run: {exc}") from exc
        if done.returncode != 0 or not partial.exists():
            partial.unlink(missing_ok=True)
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
            raise CppUnavailable(f"the C++ compiler {compiler} failed (status {done.returncode}) "
                                    f"building the sim's C++ runtime:\n{tail}")
        os.replace(partial, library)
