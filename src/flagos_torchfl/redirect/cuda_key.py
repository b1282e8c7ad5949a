"""What reaches PyTorch's CUDA dispatch key: operators called with a CUDA device, and kernels
libraries register for CUDA.

**Operators called with a CUDA device** (``torch.ops.aten.arange.start_step(0, 8, 2,
device="cuda")``, as libraries and compiled code call them, below the Python factories that the
``factories`` patch wraps). The dispatcher lets a device argument choose the kernel only for the
operators that have a ``BackendSelect`` kernel: it joins the device to the dispatch key set, so
``device="cuda"`` reaches the CUDA key. Those operators are read from the dispatcher
(:func:`device_operators`), and each gets a kernel on the CUDA key that rewrites its CUDA device
arguments to the backend's device (logical index to physical, as ``Target.translate``) and calls
the operator again. Every other operator that is given a CUDA device builds its result through
one of them (``empty_like`` through ``empty_strided``, ``to`` through ``_to_copy``). Calls that
never reach the CUDA key (every call on the backend's own tensors and devices) cost nothing.
On a CPU build of torch the CUDA key holds no kernel of its own for these operators, only
CompositeExplicitAutograd ones that take the device as given (``_to_copy`` fails in its device
guard), so a backend fallback on the CUDA key would miss most of them. On a CUDA build their
CUDA kernels are real (without a driver they fail with "Found no NVIDIA driver"); the kernel here
hands a call that names no CUDA device (a real CUDA tensor made before activation) to the kernel
it replaced.

**Kernels registered for CUDA** (``Library.impl(name, fn, "CUDA")``, and through it
``torch.library.impl(name, "cuda")``, ``register_kernel(name, "cuda")`` and
``custom_op(..., device_types="cuda")``) also serve the chip's dispatch key (``Backend.dispatch_key``:
PrivateUse1 for the sim and its profiles, CPU for the cpu backend), where the op has no kernel of
its own for that key (nor a CompositeExplicit/Implicit one covering it). Registrations made
before activation are found in ``torch.library._impls`` (Python registrations only: a compiled
extension's CUDA kernel is CUDA code) and called through ``torch.library.get_kernel``. A
library's own kernel for the chip's key registered later replaces the mirror. An operator
defined with ``torch.library.triton_op`` runs Triton kernels: on a chip that does not run Triton
it is refused with that reason, as is a ``wrap_triton`` launch on the chip's tensors.
"""
from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from .. import compat
from .devices import Target
from ..patching import Patcher
from ..registrations import keep_at_exit
from .patches import patch_function

_CUDA = "CUDA"
_DEVICE_TYPES = ("Device", "Device?", "Optional[Device]")
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
#: torch's public registration API: a registration made from these files is the caller's
_REGISTRATION_API = (os.path.join(_TORCH_DIR, "library.py"), os.path.join(_TORCH_DIR, "_library") + os.sep)


def device_operators() -> List[str]:
    """The operators whose device argument decides their kernel (a ``BackendSelect`` kernel
    and a ``Device`` argument in their schema), as qualified overload names."""
    found = []
    for name in torch._C._dispatch_get_registrations_for_dispatch_key("BackendSelect"):
        base, _, overload = name.partition(".")
        for schema in torch._C._jit_get_schemas_for_operator(base):
            if schema.overload_name == overload:
                if any(str(a.type) in _DEVICE_TYPES for a in schema.arguments):
                    found.append(name)
                break
    return sorted(found)


@functools.lru_cache(maxsize=None)
def _overload(name: str) -> Optional[Any]:
    """The ``OpOverload`` of ``ns::op[.overload]``, or None where torch.ops does not resolve it."""
    try:
        return torch._library.utils.lookup_op(name if "." in name.partition("::")[2] else name + ".default")
    except (AttributeError, RuntimeError, ValueError):
        return None


def _translated(target: Target, args: tuple, kwargs: dict) -> Optional[Tuple[tuple, dict]]:
    """``args``/``kwargs`` with every CUDA ``torch.device`` rewritten to the backend's, or None
    when none names a CUDA device."""
    def cuda(value: Any) -> bool:
        return value.__class__ is torch.device and value.type == "cuda"

    if not (any(cuda(a) for a in args) or any(cuda(v) for v in kwargs.values())):
        return None
    return (tuple(target.translate(a) if cuda(a) else a for a in args),
            {k: target.translate(v) if cuda(v) else v for k, v in kwargs.items()})


def _device_kernel(target: Target, name: str, replaced: Any) -> Callable:
    """The CUDA-key kernel of operator ``name``: its call again with the backend's device; a
    call naming no CUDA device goes to the ``replaced`` kernel (None: there was none)."""
    def kernel(keyset, *args, **kwargs):
        moved = _translated(target, args, kwargs)
        if moved is not None:
            return _overload(name)(*moved[0], **moved[1])
        if replaced is None:
            raise NotImplementedError(f"{name} reached the CUDA dispatch key without a CUDA device "
                                      f"argument; backend {target.chip_name!r} has no CUDA kernels")
        return replaced.call_boxed(keyset, *args, **kwargs)

    return kernel


@patch_function("cuda_device_operators")
def patch_cuda_device_operators(target: Target, patcher: Patcher) -> None:
    """Operators called with ``device="cuda"`` (:func:`device_operators`: ``empty``, ``arange``,
    ``full``, ``randn``, ``scalar_tensor``, ``_to_copy``...) run on the backend's device: each
    gets a kernel on the CUDA key that calls it again with the device translated."""
    cuda_build = torch.backends.cuda.is_built()
    if cuda_build and not compat.has("library_get_kernel"):
        return  # the real CUDA kernels could not be kept for calls on CUDA tensors
    mirrored = _python_registrations(_CUDA)
    libraries: Dict[str, Any] = {}

    def undo() -> None:
        for library in libraries.values():
            compat.destroy_library(library)
        _DEVICE_KERNELS.clear()

    patcher.call(lambda: None, undo, "kernels on the CUDA key for operators called with a CUDA device")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel" (CUDA builds)
        for name in device_operators():
            if name in mirrored or name.partition(".")[0] in mirrored:
                continue  # a library's own Python kernel for CUDA: it runs as written (and mirrored)
            replaced = (torch.library.get_kernel(name, _CUDA) if cuda_build
                        and torch._C._dispatch_has_computed_kernel_for_dispatch_key(name, _CUDA) else None)
            namespace = name.partition("::")[0]
            if namespace not in libraries:
                libraries[namespace] = keep_at_exit(torch.library.Library(namespace, "IMPL"))
            libraries[namespace].impl(name.partition("::")[2], _device_kernel(target, name, replaced),
                                      _CUDA, with_keyset=True)
            _DEVICE_KERNELS.add(_impls_entry(name, _CUDA))


#: the ``torch.library._impls`` entries of :func:`patch_cuda_device_operators`'s kernels (this
#: package's, not a library's kernels for CUDA: never mirrored)
_DEVICE_KERNELS: set = set()


def _impls_entry(name: str, key: str) -> str:
    """``torch.library._impls``'s entry for a kernel of ``ns::op[.overload]`` on ``key``."""
    namespace, _, rest = name.partition("::")
    return f"{namespace}/{rest}/{key}"


# ------------------------------------------------------------------ kernels registered for CUDA
def _python_registrations(key: str) -> Dict[str, str]:
    """Operators (``ns::name[.overload]``) with a kernel for ``key`` registered from Python by a
    library (``torch.library._impls``), not by torch itself -> the ``_impls`` entry."""
    found = {}
    suffix = "/" + key
    for entry in list(torch.library._impls):
        if not entry.endswith(suffix) or entry in _DEVICE_KERNELS:
            continue
        namespace, _, rest = entry.partition("/")
        name, _, entry_key = rest.rpartition("/")
        if entry_key == key and not _registered_by_torch(f"{namespace}::{name}", key):
            found[f"{namespace}::{name}"] = entry
    return found


def _registered_by_torch(qualname: str, key: str) -> bool:
    """Whether ``qualname``'s kernel for ``key`` was registered by torch's own code (its source
    file is in the torch package, outside its public registration API)."""
    try:
        debug = repr(torch.library.get_kernel(qualname, key))
    except (RuntimeError, ValueError, AttributeError):
        return True  # not resolvable: nothing a library registered that could be mirrored
    return _torch_file(debug.partition("registered at ")[2].rpartition(":")[0])


def _torch_file(path: str) -> bool:
    return path.startswith(_TORCH_DIR) and not path.startswith(_REGISTRATION_API)


def _caller_is_torch() -> bool:
    """Whether the code registering now (the first frame outside torch's registration API and
    this module) is torch's own."""
    frame = sys._getframe(2)
    while frame is not None and (frame.f_code.co_filename.startswith(_REGISTRATION_API)
                                 or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    return frame is not None and _torch_file(frame.f_code.co_filename)


def _is_triton_op(qualname: str) -> bool:
    """Whether ``qualname`` was defined with ``torch.library.triton_op`` (it runs Triton kernels)."""
    triton = sys.modules.get("torch._library.triton")
    return triton is not None and qualname.partition(".")[0] in getattr(triton, "triton_ops_to_kernels", {})


class _Mirrors:
    """The CUDA kernels serving the chip's key: one ``Library`` per operator, so that a library's
    own kernel for that key, registered later, replaces just that one."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.key = target.chip.dispatch_key
        self.runs_triton = target.chip.runs_triton
        self.libraries: Dict[str, Any] = {}
        self.lock = threading.RLock()

    def covered(self, qualname: str) -> bool:
        """Whether ``qualname`` has a kernel of its own for the chip's key, or a composite one
        covering it (a backend fallback, such as the routing layer's, is none)."""
        has = torch._C._dispatch_has_kernel_for_dispatch_key
        return any(has(qualname, key) for key in (self.key,) + _COVERING)

    def add(self, qualname: str, kernel: Callable, with_keyset: bool) -> None:
        """Serve ``qualname`` at the chip's key with ``kernel`` unless it has a kernel there."""
        with self.lock:
            if qualname in self.libraries or self.covered(qualname):
                return
            if _is_triton_op(qualname) and not self.runs_triton:
                kernel, with_keyset = self._refusal(qualname), False
            library = keep_at_exit(torch.library.Library(qualname.partition("::")[0], "FRAGMENT"))
            keyset = {"with_keyset": True} if with_keyset else {}  # torch 2.1's impl takes no with_keyset
            library.impl(qualname.partition("::")[2], kernel, self.key, **keyset)
            self.libraries[qualname] = library

    def refuse_triton(self, qualname: str) -> None:
        """A ``triton_op`` (its CompositeExplicitAutograd kernel covers every key) is refused at
        the chip's key where the chip does not run Triton."""
        with self.lock:
            if self.runs_triton or qualname in self.libraries:
                return
            library = keep_at_exit(torch.library.Library(qualname.partition("::")[0], "FRAGMENT"))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                library.impl(qualname.partition("::")[2], self._refusal(qualname), self.key)
            self.libraries[qualname] = library

    def _refusal(self, qualname: str) -> Callable:
        reason = triton_refusal(self.target, f"operator {qualname} (torch.library.triton_op)")

        def kernel(*args, **kwargs):
            raise NotImplementedError(reason)

        return kernel

    def drop(self, qualname: str) -> None:
        """The library now registers its own kernel at the chip's key: the mirror steps aside."""
        with self.lock:
            library = self.libraries.pop(qualname, None)
        if library is not None:
            compat.destroy_library(library)

    def remove_all(self) -> None:
        with self.lock:
            libraries, self.libraries = list(self.libraries.values()), {}
        for library in libraries:
            compat.destroy_library(library)


def triton_refusal(target: Target, what: str) -> str:
    """Why ``what`` (a Triton kernel, or an operator running one) does not run on ``target``'s chip."""
    return (f"{what} needs Triton, and backend {target.chip_name!r} (device type "
            f"{target.device_type!r}) does not run Triton: Triton generates code for GPUs whose "
            "vendor ships a Triton backend. Register a kernel for the device type "
            f"{target.device_type!r} (torch.library.register_kernel) or a composite of torch "
            "operators (device_types=None) to run it here")


def _key_of(library: Any, dispatch_key: str) -> str:
    return dispatch_key or getattr(library, "dispatch_key", "") or "CompositeImplicitAutograd"


_COVERING = ("CompositeExplicitAutograd", "CompositeImplicitAutograd",
             "CompositeExplicitAutogradNonFunctional")


@patch_function("cuda_kernels_on_chip")
def patch_cuda_kernels_on_chip(target: Target, patcher: Patcher) -> None:
    """A library's Python kernel for CUDA serves the chip's dispatch key too, where the operator
    has none of its own there: those registered before activation now, later ones as they are
    registered (``Library.impl``, which ``torch.library.impl``, ``register_kernel`` and
    ``custom_op`` call). Deactivation removes every mirror."""
    mirrors = _Mirrors(target)
    if target.chip.dispatch_key == _CUDA:
        return
    patcher.call(lambda: None, mirrors.remove_all, "kernels mirrored from the CUDA key")
    if compat.has("library_get_kernel"):
        for qualname in _python_registrations(_CUDA):
            mirrors.add(qualname, _registered_kernel(qualname), True)
    triton = sys.modules.get("torch._library.triton")
    for qualname in list(getattr(triton, "triton_ops_to_kernels", {})):
        if _overload(qualname) is not None:
            mirrors.refuse_triton(qualname)

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def impl(self, op_name, fn, dispatch_key="", *args, **kwargs):
            key = _key_of(self, dispatch_key)
            qualname = _qualname(self, op_name)
            if key == mirrors.key or key in _COVERING:
                mirrors.drop(qualname)  # the library's own kernel (or composite) serves the key
            result = original(self, op_name, fn, dispatch_key, *args, **kwargs)
            if key == _CUDA and not _caller_is_torch():
                mirrors.add(qualname, fn, bool(kwargs.get("with_keyset", False)))
            return result

        return impl

    patcher.wrap(torch.library.Library, "impl", make)
    patcher.when_imported("torch._library.triton", lambda module: _wrap_triton_op(module, mirrors, patcher),
                          "triton_op refused where the chip does not run Triton")


def _registered_kernel(qualname: str) -> Callable:
    """A kernel calling ``qualname``'s current kernel for CUDA (a Python one, found registered)."""
    kernel = torch.library.get_kernel(qualname, _CUDA)

    def mirror(keyset, *args, **kwargs):
        return kernel.call_boxed(keyset, *args, **kwargs)

    return mirror


def _qualname(library: Any, op_name: Any) -> str:
    name = op_name if isinstance(op_name, str) else op_name.name()
    qualname = name if "::" in name else f"{library.ns}::{name}"
    return qualname[:-len(".default")] if qualname.endswith(".default") else qualname


def _wrap_triton_op(module: Any, mirrors: _Mirrors, patcher: Patcher) -> None:
    """``torch.library.triton_op`` made while active: the operator is refused at the chip's key
    where the chip does not run Triton."""
    if mirrors.runs_triton:
        return

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def triton_op(name, fn=None, /, *args, **kwargs):
            made = original(name, fn, *args, **kwargs)
            if fn is not None:
                mirrors.refuse_triton(name)
                return made

            def decorate(function):
                result = made(function)
                mirrors.refuse_triton(name)
                return result

            return decorate

        return triton_op

    original = patcher.wrap(module, "triton_op", make)
    patcher.replace_in((torch.library,), "triton_op", original, module.triton_op)


@patch_function("triton_launches", waits_for="torch._higher_order_ops.triton_kernel_wrap")
def patch_triton_launches(target: Target, patcher: Patcher) -> None:
    """A ``wrap_triton`` launch with a tensor on the backend's device is refused, naming the
    reason, where the chip does not run Triton (Triton itself fails there with "0 active
    drivers" or a pointer it cannot access); launches on other devices go on unchanged."""
    if target.chip.runs_triton:
        return
    from torch._higher_order_ops.triton_kernel_wrap import TraceableTritonKernelWrapper as wrapper

    own = target.device_type

    def make(original: Callable) -> Callable:
        @functools.wraps(original)
        def launch(self, *args, **kwargs):
            if any(isinstance(a, torch.Tensor) and a.device.type == own
                   for a in itertools.chain(args, kwargs.values())):
                raise NotImplementedError(triton_refusal(
                    target, f"the Triton kernel {getattr(self.kernel, '__name__', self.kernel)!r} (wrap_triton)"))
            return original(self, *args, **kwargs)

        return launch

    for name in ("__call__", "run"):
        patcher.wrap(wrapper, name, make)
