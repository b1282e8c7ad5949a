"""Version checks and feature detection: the torch this package runs on, the torch internals it
relies on, and the vendor plugins it drives.

Every torch internal the package needs that is not in all supported releases is detected here
(:data:`FEATURES`: what it is, how it is found, the releases it was checked on) and the rest of
the package asks :func:`has` or uses the shims below, never a version number.
"""
from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

#: the oldest torch for everything a vendor chip uses: selection, detect/env/ops, the
#: redirection and the launcher, memory and precision settings, checkpoints, distributed
MIN_TORCH = (2, 1)
#: torch minor versions the test suite has run on (docs/design.md's compatibility table).
TESTED_TORCH = ((2, 1), (2, 13), (2, 14))
#: the pure-Python ``sim`` device needs the PrivateUse1 Python-backend API.
SIM_MIN_TORCH = (2, 9)

_warned: set[str] = set()


def parse_version(text: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``; unparseable parts end the tuple."""
    parts = []
    for piece in re.split(r"[.+-]", str(text)):
        if not piece.isdigit():
            break
        parts.append(int(piece))
    return tuple(parts)


def tested_torch_text() -> str:
    return ", ".join(f"{a}.{b}" for a, b in TESTED_TORCH)


def check_torch(version: str) -> None:
    """Raise for a torch older than the floor; warn once for a version the suite has not run on."""
    v = parse_version(version)[:2]
    if v < MIN_TORCH:
        raise ImportError(floor_message(version))
    if v not in TESTED_TORCH:
        warn_once(
            "torch",
            f"torch {version} is untested with flagos_torchfl (tested: torch {tested_torch_text()}); "
            "please report problems with `python -m flagos_torchfl env`",
        )


def floor_message(version: str) -> str:
    """The one sentence said below the floor."""
    return (f"flagos_torchfl needs torch>={MIN_TORCH[0]}.{MIN_TORCH[1]} (the sim device "
            f"torch>={SIM_MIN_TORCH[0]}.{SIM_MIN_TORCH[1]}); this is torch {version}")


def running_command_line(argv: list) -> bool:
    """Whether this process is the package's command line (``python -m flagos_torchfl``, whose
    ``argv[0]`` is ``"-m"`` while the package is imported, or the ``flagos-torchfl`` script)."""
    first = str(argv[0]) if argv else ""
    return first == "-m" or first.replace("\\", "/").rsplit("/", 1)[-1] == "flagos-torchfl"


def check_plugin(module: str, version: str | None, tested: tuple[str, ...]) -> None:
    """Warn once when a vendor plugin's version is outside the versions tested with this package."""
    if version is None:
        return
    v = parse_version(version)[:2]
    if any(parse_version(t)[:2] == v for t in tested):
        return
    tested_text = ", ".join(tested) if tested else "none yet"
    warn_once(module, f"{module} {version} is untested with flagos_torchfl (tested: {tested_text})")


def torch_support() -> dict:
    """The installed torch and the floors (``detect`` shows them)."""
    import torch

    return {"version": torch.__version__, "minimum": ".".join(map(str, MIN_TORCH)),
            "sim_minimum": ".".join(map(str, SIM_MIN_TORCH))}


def sim_floor_reason(version: str) -> str:
    """Why the sim cannot run on this torch (the sim's own floor)."""
    return f"needs torch>={SIM_MIN_TORCH[0]}.{SIM_MIN_TORCH[1]}; this is torch {version}"


def require_torch(feature: str, minimum: tuple[int, int], version: str) -> None:
    """Raise a clear error when ``feature`` needs a newer torch than the one installed."""
    if parse_version(version)[:2] < minimum:
        raise RuntimeError(
            f"{feature} needs torch>={minimum[0]}.{minimum[1]}; this is torch {version}"
        )


def warn_once(key: str, message: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, UserWarning, stacklevel=3)


# ---------------------------------------------------------------- torch internals, detected

@dataclass(frozen=True)
class Feature:
    """A torch internal the package relies on that not every supported release has."""

    name: str
    what: str
    #: torch releases this detection was checked on, with the answer there
    checked: Dict[str, bool]
    probe: Callable[[], bool]


def _attr(path: str) -> Callable[[], bool]:
    """A probe: whether dotted ``path`` (``torch.x.y``) resolves, importing modules on the way."""

    def probe() -> bool:
        import importlib

        parts = path.split(".")
        try:
            obj = importlib.import_module(parts[0])
            for i, part in enumerate(parts[1:], 1):
                try:
                    obj = getattr(obj, part)
                except AttributeError:
                    obj = importlib.import_module(".".join(parts[: i + 1]))
        except (ImportError, AttributeError):
            return False
        return True

    return probe


def _current_accelerator_check_available() -> bool:
    import inspect

    import torch

    accelerator = getattr(torch, "accelerator", None)
    return accelerator is not None and "check_available" in inspect.signature(
        accelerator.current_accelerator).parameters


_OLD, _NEW = "2.1.2", "2.13.0"
#: the answer of a feature torch 2.1 lacks, on each release it was checked on
_SINCE_AFTER_2_1 = {_OLD: False, _NEW: True, "2.14.1": True}
FEATURES: Dict[str, Feature] = {f.name: f for f in (
    Feature("accelerator", "torch.accelerator (the device-generic accelerator API)",
            _SINCE_AFTER_2_1, _attr("torch.accelerator")),
    Feature("accelerator_check_available", "torch.accelerator.current_accelerator(check_available=)",
            _SINCE_AFTER_2_1, _current_accelerator_check_available),
    Feature("stream_event", "torch.Stream / torch.Event (the device-generic stream and event classes)",
            _SINCE_AFTER_2_1, _attr("torch.Event")),
    Feature("get_device_module", "torch.get_device_module(device)",
            _SINCE_AFTER_2_1, _attr("torch.get_device_module")),
    Feature("amp_grad_scaler", "torch.amp.GradScaler (device-generic; before it torch.cuda.amp.GradScaler)",
            _SINCE_AFTER_2_1, _attr("torch.amp.GradScaler")),
    Feature("out_of_memory_error", "torch.OutOfMemoryError (before it torch.cuda.OutOfMemoryError)",
            _SINCE_AFTER_2_1, _attr("torch.OutOfMemoryError")),
    Feature("pytree_tree_leaves", "torch.utils._pytree.tree_leaves",
            _SINCE_AFTER_2_1, _attr("torch.utils._pytree.tree_leaves")),
    Feature("autocast_available", "torch._C._is_autocast_available / _dispatch_key_for_device",
            _SINCE_AFTER_2_1, _attr("torch._C._is_autocast_available")),
    Feature("amp_is_autocast_available", "torch.amp.is_autocast_available(device_type)",
            _SINCE_AFTER_2_1, _attr("torch.amp.is_autocast_available")),
    Feature("autocast_device_queries", "torch.get_autocast_dtype(device_type) / is_autocast_enabled(device_type)",
            _SINCE_AFTER_2_1, _attr("torch.get_autocast_dtype")),
    Feature("library_destroy", "torch.library.Library._destroy (deregisters a Python library's kernels)",
            _SINCE_AFTER_2_1, _attr("torch.library.Library._destroy")),
    Feature("autocast_cpu_float16", "torch.autocast('cpu', dtype=torch.float16)",
            _SINCE_AFTER_2_1, lambda: _cpu_autocast_float16()),
    Feature("cpu_float16_matmul", "float16 matrix products on the CPU (addmm for Half)",
            _SINCE_AFTER_2_1, lambda: _cpu_float16_matmul()),
    Feature("get_default_device", "torch.get_default_device()",
            _SINCE_AFTER_2_1, _attr("torch.get_default_device")),
    Feature("fsdp2", "FSDP2 (torch.distributed.fsdp.fully_shard)",
            _SINCE_AFTER_2_1, _attr("torch.distributed.fsdp.fully_shard")),
    Feature("inductor_backend_registration",
            "torch._inductor.codegen.common.init_backend_registration (registers Inductor's own code generators)",
            _SINCE_AFTER_2_1, _attr("torch._inductor.codegen.common.init_backend_registration")),
    Feature("dynamo_trace_rules",
            "torch._dynamo.trace_rules (dynamo's tables of torch functions and Tensor methods, which keep the "
            "wrapped functions' originals: without it a wrapper breaks the graph under a TorchFunctionMode)",
            _SINCE_AFTER_2_1, _attr("torch._dynamo.trace_rules")),
    Feature("inductor_device_op_overrides",
            "torch._inductor.codegen.common.register_device_op_overrides (a device's op overrides for Inductor)",
            {_NEW: True, "2.14.1": True}, _attr("torch._inductor.codegen.common.register_device_op_overrides")),
    Feature("inductor_backend_options",
            "register_backend_for_device(device_fx_wrapper_codegen=, device_custom_pass=) (a device's FX wrapper "
            "and its graph pass, part of Inductor's cache key)",
            {_NEW: True, "2.14.1": True}, lambda: _inductor_backend_options()),
    Feature("dynamo_unhooks_optimizer_steps",
            "torch.compile taking the step-hook wrapper off torch.optim's optimizers (dynamo's TorchPatcher.patch)",
            {_OLD: True, _NEW: False, "2.14.1": False}, lambda: _dynamo_unhooks_optimizer_steps()),
    Feature("device_mesh", "torch.distributed.device_mesh (init_device_mesh, DeviceMesh)",
            _SINCE_AFTER_2_1, _attr("torch.distributed.device_mesh.DeviceMesh")),
    Feature("library_fallback", "torch.library.Library.fallback (a Python backend fallback for a dispatch key)",
            _SINCE_AFTER_2_1, _attr("torch.library.Library.fallback")),
    Feature("library_get_kernel", "torch.library.get_kernel (a key's registered kernel, callable boxed)",
            _SINCE_AFTER_2_1, _attr("torch.library.get_kernel")),
    Feature("dcp_state_dict", "torch.distributed.checkpoint.state_dict (get_state_dict, set_state_dict)",
            _SINCE_AFTER_2_1,
            _attr("torch.distributed.checkpoint.state_dict.get_state_dict")),
    Feature("fsdp_cpu", "FSDP1 on CPU tensors (torch.cpu.Stream(priority=), which FSDP1 creates)",
            _SINCE_AFTER_2_1, lambda: _cpu_stream_takes_priority()),
    Feature("load_weights_only_default", "torch.load refusing a pickle that carries code by default "
            "(weights_only=True unless asked otherwise)",
            _SINCE_AFTER_2_1, _attr("torch.serialization._default_to_weights_only")),
    Feature("python_privateuse1_backend",
            "a Python-registered PrivateUse1 backend with its own allocator and accelerator hooks (the sim)",
            _SINCE_AFTER_2_1, lambda: _torch_at_least(SIM_MIN_TORCH) and not sim_missing()),
    Feature("alloc_conf_variable", "torch's caching allocator reads PYTORCH_ALLOC_CONF (falling back to "
            "the older PYTORCH_CUDA_ALLOC_CONF; before torch 2.9 it reads only the latter)",
            _SINCE_AFTER_2_1, lambda: _torch_at_least((2, 9))),
)}


def _dynamo_unhooks_optimizer_steps() -> bool:
    import inspect

    from torch._dynamo import eval_frame

    patcher = getattr(eval_frame, "TorchPatcher", None)
    patch = getattr(patcher, "patch", None)
    code = getattr(inspect.unwrap(patch), "__code__", None) if patch is not None else None
    return code is not None and "unwrapped_step" in code.co_varnames


def _inductor_backend_options() -> bool:
    import inspect

    try:
        from torch._inductor.codegen import common
    except ImportError:
        return False
    accepted = inspect.signature(common.register_backend_for_device).parameters
    return {"device_fx_wrapper_codegen", "device_custom_pass"} <= set(accepted)


def _cpu_autocast_float16() -> bool:
    import torch

    try:
        with torch.autocast("cpu", dtype=torch.float16):
            return True
    except RuntimeError:  # torch 2.1: "AutocastCPU only support Bfloat16"
        return False


def _cpu_float16_matmul() -> bool:
    import torch

    try:
        torch.nn.functional.linear(torch.ones(1, 2, dtype=torch.half), torch.ones(2, 2, dtype=torch.half))
        return True
    except RuntimeError:  # torch 2.1: "addmm_impl_cpu_" not implemented for 'Half'
        return False


def _cpu_stream_takes_priority() -> bool:
    import torch

    try:
        torch.cpu.Stream(priority=0)
        return True
    except TypeError:  # torch 2.1: "Stream() takes no arguments"
        return False


#: what the sim (a Python PrivateUse1 backend with its own allocator and accelerator hooks) needs
#: of torch beyond its release floor :data:`SIM_MIN_TORCH`, each with its probe
SIM_NEEDS = (
    ("torch._C._acc (Python PrivateUse1 backends)", _attr("torch._C._acc")),
    ("torch._C._construct_storage_from_data_pointer", _attr("torch._C._construct_storage_from_data_pointer")),
    ("torch.UntypedStorage._swap_data_ptr_", _attr("torch.UntypedStorage._swap_data_ptr_")),
    ("torch.library.Library.fallback", _attr("torch.library.Library.fallback")),
    ("torch.accelerator", _attr("torch.accelerator")),
)


def sim_missing() -> list[str]:
    """What of :data:`SIM_NEEDS` this torch lacks (empty when none)."""
    return [name for name, probe in SIM_NEEDS if not probe()]


def _torch_at_least(minimum: tuple) -> bool:
    import torch

    return parse_version(torch.__version__)[:2] >= tuple(minimum)


@functools.lru_cache(maxsize=None)
def has(name: str) -> bool:
    """Whether this torch has feature ``name`` of :data:`FEATURES` (an unknown name raises
    KeyError naming the known ones)."""
    if name not in FEATURES:
        raise KeyError(f"unknown torch feature {name!r}; known: {', '.join(sorted(FEATURES))}")
    return bool(FEATURES[name].probe())


def out_of_memory_error() -> type:
    """torch's out-of-memory exception type (``torch.OutOfMemoryError`` or, before it,
    ``torch.cuda.OutOfMemoryError``, the same class)."""
    import torch

    return torch.OutOfMemoryError if has("out_of_memory_error") else torch.cuda.OutOfMemoryError


def grad_scaler_class() -> type:
    """The device-generic GradScaler (``torch.amp.GradScaler``; before it the CUDA one)."""
    import torch

    return torch.amp.GradScaler if has("amp_grad_scaler") else torch.cuda.amp.GradScaler


def accelerator_module() -> Optional[Any]:
    """``torch.accelerator``, or None on a torch without it."""
    import torch

    return torch.accelerator if has("accelerator") else None


def tree_leaves(tree: Any) -> list:
    """The leaves of a pytree (``torch.utils._pytree.tree_leaves``; its flatten before it)."""
    from torch.utils import _pytree

    if has("pytree_tree_leaves"):
        return _pytree.tree_leaves(tree)
    return _pytree.tree_flatten(tree)[0]


#: device types with an autocast in a torch that cannot be asked (before amp.is_autocast_available),
#: and their dispatch-key suffix (torch 2.1's ``autocast.__init__`` accepts these)
_AUTOCAST_KEYS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU", "hpu": "HPU", "xla": "XLA"}


def _old_dispatch_suffix(device_type: str) -> Optional[str]:
    import torch

    if device_type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    return _AUTOCAST_KEYS.get(device_type)


def autocast_available(device_type: str) -> bool:
    """Whether torch has an autocast for ``device_type``."""
    import torch

    if has("amp_is_autocast_available"):
        return torch.amp.is_autocast_available(device_type)
    return _old_dispatch_suffix(device_type) is not None


def inductor_has_codegen(device_type: str) -> bool:
    """Whether Inductor has a code generator for ``device_type``, PyTorch's own and the plugins'
    registrations included (torch 2.1 registers its own two, CPU and CUDA, only when its first
    graph lowers)."""
    from torch._inductor.codegen import common

    if has("inductor_backend_registration"):
        common.init_backend_registration()
    elif device_type in ("cpu", "cuda"):
        return True
    return common.get_scheduling_for_device(device_type) is not None


def autocast_takes(device_type: str, dtype: Any) -> bool:
    """Whether torch's autocast for ``device_type`` can run in ``dtype`` (torch 2.1's CPU autocast
    takes bfloat16 only; on other devices torch itself decides)."""
    import torch

    if device_type == "cpu" and dtype != torch.bfloat16:
        return has("autocast_cpu_float16")
    return True


def autocast_dispatch_suffix(device_type: str) -> str:
    """The dispatch-key suffix of a device type with autocast (``"CPU"``, ``"PrivateUse1"``);
    ValueError for one without."""
    import torch

    if has("autocast_available"):
        if not torch._C._is_autocast_available(device_type):
            raise ValueError(f"device type {device_type!r} has no autocast in this PyTorch")
        return torch._C._dispatch_key_for_device(device_type)
    suffix = _old_dispatch_suffix(device_type)
    if suffix is None:
        raise ValueError(f"device type {device_type!r} has no autocast in this PyTorch")
    return suffix


#: before the device-taking queries: torch's per-device query names (else the device module's)
_OLD_QUERY_NAMES = {"cpu": "cpu", "cuda": "gpu", "ipu": "ipu", "xla": "xla"}


def _old_autocast_query(device_type: str, enabled: bool) -> Optional[Callable[[], Any]]:
    import torch

    infix = _OLD_QUERY_NAMES.get(device_type)
    if infix is not None:
        if enabled:
            return torch.is_autocast_enabled if device_type == "cuda" else getattr(torch, f"is_autocast_{infix}_enabled")
        return getattr(torch, f"get_autocast_{infix}_dtype")
    # a PrivateUse1 device's module answers for it (torch 2.1's autocast requires these)
    module = getattr(torch, device_type, None)
    return getattr(module, "is_autocast_enabled" if enabled else "get_autocast_dtype", None)


def autocast_dtype(device_type: str):
    """The autocast dtype in force for ``device_type``."""
    import torch

    if has("autocast_device_queries"):
        return torch.get_autocast_dtype(device_type)
    return _old_autocast_query(device_type, enabled=False)()


def autocast_enabled(device_type: str) -> bool:
    """Whether autocast is on for ``device_type``."""
    import torch

    if has("autocast_device_queries"):
        return torch.is_autocast_enabled(device_type)
    return _old_autocast_query(device_type, enabled=True)()


def autocast_query_functions(device_type: str) -> tuple:
    """On a torch whose autocast queries take no device type: ``(is_enabled, get_dtype)`` of
    ``device_type``, each taking no argument (None where its device module has none)."""
    return _old_autocast_query(device_type, True), _old_autocast_query(device_type, False)


def destroy_library(library: Any) -> None:
    """Deregister every kernel of a ``torch.library.Library`` now (``Library._destroy``; before
    it: forget its registrations and drop its C++ handle, which deregisters them)."""
    if has("library_destroy"):
        library._destroy()
        return
    import torch.library

    torch.library._impls -= library._op_impls
    library._op_impls.clear()
    library.m = None
