"""Collectives: ``init_process_group("nccl")`` and ``new_group(backend="nccl")`` use the
backend's collective library, ``Backend.default_device_backend_map`` sends ``cuda`` there too,
and ``DistributedDataParallel(device_ids=[N], output_device=N)`` and ``barrier(device_ids=[N])``
address the backend's device. Where torch is built without NCCL, ``torch.distributed.ProcessGroupNCCL``
stands for the chip's collective (its backends are instances, its ``Options()`` are NCCL's,
accepted and dropped by ``init_process_group``/``new_group``).

``dist.get_backend()`` stays truthful: it names the library really in use (``gloo``, ``hccl``...).

Each patch waits for the module it changes (``waits_for``): activation imports none of
``torch.distributed``'s optional parts (FSDP, DTensor...), and on a torch built without
distributed support, whose ``import torch`` loads none of these modules, nothing is patched.
"""
from __future__ import annotations

import copy
import datetime
import functools
import sys
from typing import Any, Optional

import torch

from .. import compat
from ..data_files import read_json
from .devices import Target
from ..patching import Patcher, with_edited_arguments
from .patches import patch_function


def translate_backend(target: Target, backend: Any) -> Any:
    """``"nccl"`` -> the backend's collective; ``"cuda:nccl,cpu:gloo"`` -> per-device pairs with
    ``cuda`` and ``nccl`` translated (duplicate device entries merged, first kept). Anything
    else is returned unchanged."""
    if not isinstance(backend, str):
        return backend
    if ":" not in backend:
        return target.collective if backend.lower() == "nccl" else backend
    pairs = {}
    for item in backend.split(","):
        device, _, library = item.strip().partition(":")
        device = target.device_type if device.strip() == "cuda" else device.strip()
        library = target.collective if library.strip().lower() == "nccl" else library.strip()
        pairs.setdefault(device, library)
    return ",".join(f"{d}:{b}" for d, b in pairs.items())


def _device_index(target: Target, value: Any) -> Any:
    """A DDP device id (int, "cuda:N", torch.device) as the backend's physical index."""
    translated = target.translate(value)
    return translated.index if isinstance(translated, torch.device) else translated


def _device_id(target: Target, value: Any) -> Optional[torch.device]:
    """``init_process_group(device_id=...)``: the target device; None where the chip binds no
    device to a process group (the CPU)."""
    if value is None or not target.chip.binds_process_group_device:
        return None
    translated = target.translate(value)
    return translated if isinstance(translated, torch.device) else value


def _rebinding(target: Target, original, names, fills_backend: bool) -> Any:
    def edit(values: dict) -> None:
        if _nccl_options(values.get("pg_options")):
            values["pg_options"] = None  # see patch_process_group_nccl
        if values.get("backend") is not None:
            values["backend"] = translate_backend(target, values["backend"])
        elif fills_backend and values.get("device_id") is not None:
            # torch names the backend after the device_id's type: on the chip, its collective
            # (also where the chip binds no device and the device_id is dropped below)
            values["backend"] = target.collective
        if "device_id" in names and values.get("device_id") is not None:
            values["device_id"] = _device_id(target, values["device_id"])

    return with_edited_arguments(original, edit)


def _nccl_options(value: Any) -> bool:
    """Whether ``value`` is a ``ProcessGroupNCCL.Options`` (torch's, or the stand-in's)."""
    nccl = getattr(sys.modules.get("torch.distributed.distributed_c10d"), "ProcessGroupNCCL", None)
    return nccl is not None and isinstance(value, nccl.Options)


@patch_function("process_group", waits_for="torch.distributed.distributed_c10d")
def patch_process_group(target: Target, patcher: Patcher) -> None:
    """``init_process_group(backend="nccl", device_id=N)``, ``new_group(backend="nccl")`` and
    ``Backend.default_device_backend_map["cuda"]`` -> the backend's collective library; their
    ``pg_options=ProcessGroupNCCL.Options()`` is dropped (:func:`patch_process_group_nccl`)."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    for name, params in (("init_process_group", ("backend", "device_id")), ("new_group", ("backend", "device_id"))):
        original = getattr(c10d, name)
        # init_process_group(device_id=...) without a backend: torch names it after the device
        wrapper = _rebinding(target, original, params, fills_backend=name == "init_process_group")
        patcher.replace_in((c10d, dist), name, original, wrapper)
    table = c10d.Backend.default_device_backend_map
    patcher.setitem(table, "cuda", target.collective)
    if target.device_type not in table:
        patcher.setitem(table, target.device_type, target.collective)


@patch_function("nccl_queries", waits_for="torch.distributed.distributed_c10d")
def patch_nccl_queries(target: Target, patcher: Patcher) -> None:
    """``torch.distributed.is_nccl_available()`` and ``is_backend_available("nccl")`` answer
    whether ``init_process_group("nccl")`` works here: whether the backend's collective library
    is available (code written ``"nccl" if dist.is_nccl_available() else "gloo"`` then picks
    the chip's library, as torch_npu's ``transfer_to_npu`` makes it answer HCCL's availability).
    Only the public names are answered so: torch's own ``distributed_c10d`` asks its module
    function before it reaches for NCCL's classes, which a build without NCCL lacks."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    available = c10d.is_backend_available

    def is_nccl_available() -> bool:
        return available(target.collective)

    def is_backend_available(backend: str) -> bool:
        return available(translate_backend(target, backend) if isinstance(backend, str) else backend)

    for name, wrapper in (("is_nccl_available", is_nccl_available), ("is_backend_available", is_backend_available)):
        original = getattr(dist, name)
        wrapper.__doc__, wrapper.__wrapped__ = original.__doc__, original
        patcher.setattr(dist, name, wrapper)


@patch_function("process_group_nccl", waits_for="torch.distributed.distributed_c10d")
def patch_process_group_nccl(target: Target, patcher: Patcher) -> None:
    """``torch.distributed.ProcessGroupNCCL`` (and ``distributed_c10d.ProcessGroupNCCL``) where
    torch is built without NCCL, since ``dist.is_nccl_available()`` says True (``nccl_queries``):
    a stand-in for the chip's collective. ``isinstance(backend, ProcessGroupNCCL)`` is True for
    the backend a live group runs on the chip's device (``group._get_backend(torch.device(<the
    chip's type>))``: gloo's on the cpu backend, the sim's ``simccl`` group), False for a
    ``ProcessGroup`` (as with NCCL) and for every other backend; it cannot be constructed.
    ``ProcessGroupNCCL.Options()`` has NCCL's attributes and defaults (``data/nccl_options.json``)
    and NCCL's class constants; ``init_process_group``/``new_group`` drop it (``process_group``),
    as torch drops ``pg_options`` for gloo: every setting in it (``is_high_priority_stream``, the
    ``config`` of NCCL's communicator, ``split_from``/``split_color``) tunes an NCCL communicator
    the chip's collective does not have, and none changes a result; the group's timeout is the
    ``timeout`` argument, which NCCL too puts over the options' ``_timeout``.

    A CUDA build keeps its own class, which ``distributed_c10d`` itself tests backends against
    before it calls NCCL's methods: there ``isinstance`` is False for the chip's backend (code
    takes the path it takes with gloo), and its ``Options()`` are dropped as above."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if hasattr(c10d, "ProcessGroupNCCL") or not dist.is_available():
        return
    stand_in = _process_group_nccl(target, c10d)
    for module in (c10d, dist):
        patcher.setitem(vars(module), "ProcessGroupNCCL", stand_in)


@functools.lru_cache(maxsize=1)
def _nccl_table() -> dict:
    return read_json("nccl_options.json")


class _ChipCollective(type):
    """The stand-in's type: its instances are the chip's collective's backends."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return cls._runs_on_chip(obj)


def _process_group_nccl(target: Target, c10d: Any) -> type:
    """The stand-in class of :func:`patch_process_group_nccl`."""
    table = _nccl_table()
    device = torch.device(target.device_type)
    backend_class = torch._C._distributed_c10d.Backend  # (c10d.Backend is the names' class)

    class NCCLConfig:
        """NCCL's communicator settings, each left to NCCL by default."""

        __slots__ = tuple(table["config"])

        def __init__(self) -> None:
            for name, value in table["config"].items():
                setattr(self, name, value)

    class Options(getattr(backend_class, "Options", object)):
        """``ProcessGroupNCCL.Options(is_high_priority_stream=False)``: NCCL's attributes."""

        def __init__(self, is_high_priority_stream: bool = False) -> None:
            defaults = dict(table["options"])
            super().__init__(defaults.pop("backend"), datetime.timedelta(seconds=defaults.pop("timeout_seconds")))
            for name, value in defaults.items():
                setattr(self, name, copy.copy(value))
            self.config = NCCLConfig()
            self.is_high_priority_stream = is_high_priority_stream

    def runs_on_chip(obj: Any) -> bool:
        if not isinstance(obj, backend_class):
            return False
        for group in list(getattr(c10d._world, "pg_map", ())):
            try:
                if group._get_backend(device) is obj:
                    return True
            except RuntimeError:  # the group has no backend for the chip's device
                continue
        return False

    def refuse(self: Any, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            f"ProcessGroupNCCL cannot be constructed here: NCCL is not built into this torch, and "
            f"init_process_group('nccl') / new_group(backend='nccl') run on the collective "
            f"{target.collective!r} of backend {target.chip_name!r}: create groups with them")

    namespace = {"__doc__": f"NCCL's process group, answered by {target.collective!r}: see "
                            "flagos_torchfl.redirect.distributed.patch_process_group_nccl.",
                 "__module__": "torch.distributed.distributed_c10d", "__init__": refuse,
                 "Options": Options, "NCCLConfig": NCCLConfig,
                 "_runs_on_chip": staticmethod(runs_on_chip), **table["constants"]}
    return _ChipCollective("ProcessGroupNCCL", (), namespace)


#: the reducing entry points PREMUL_SUM reaches (FSDP2's ``set_gradient_divide_factor``:
#: ``reduce_scatter_single``, ``reduce_scatter_tensor`` before torch 2.13), with the argument
#: holding the tensors they scale; those this torch lacks are skipped
_PREMUL_SUM_INPUTS = {"all_reduce": "tensor", "reduce_scatter_single": "input",
                      "reduce_scatter_tensor": "input", "reduce_scatter": "input_list"}


@patch_function("premul_sum", waits_for="torch.distributed.distributed_c10d")
def patch_premul_sum(target: Target, patcher: Patcher) -> None:
    """``all_reduce`` and the reduce-scatters (:data:`_PREMUL_SUM_INPUTS`) with
    ``op=ReduceOp.PREMUL_SUM(factor)`` on the chip's tensors, where the chip says its library
    runs them here (``Backend.runs_premul_sum_at_entry``: the cpu backend and the sim, whose
    collectives are gloo's): the inputs are multiplied by the factor, then reduced with SUM, which is what
    PREMUL_SUM means (NCCL multiplies each input before it sums). ``all_reduce`` scales its
    tensor in place, as it overwrites it; the reduce-scatters scale a copy of their inputs."""
    if not target.chip.runs_premul_sum_at_entry():
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def premul_factor(op: Any) -> Any:
        if isinstance(op, c10d.ReduceOp) and op == c10d.ReduceOp.PREMUL_SUM:
            return op.__getstate__()[1]
        return None

    def on_chip(value: Any) -> bool:
        first = value[0] if isinstance(value, (list, tuple)) and value else value
        return isinstance(first, torch.Tensor) and first.device.type == target.device_type

    for name, argument in _PREMUL_SUM_INPUTS.items():
        def edit(values: dict, argument: str = argument) -> None:
            factor = premul_factor(values.get("op"))
            if factor is None or not on_chip(values.get(argument)):
                return
            value = values[argument]
            if argument == "tensor":
                value.mul_(factor)
            elif isinstance(value, torch.Tensor):
                values[argument] = value * factor
            else:
                values[argument] = [t * factor for t in value]
            values["op"] = c10d.ReduceOp.SUM

        original = getattr(c10d, name, None)
        if original is not None:
            patcher.replace_in((c10d, dist), name, original, with_edited_arguments(original, edit))


@patch_function("ddp", on_cuda=True, waits_for="torch.nn.parallel.distributed")
def patch_ddp(target: Target, patcher: Patcher) -> None:
    """``DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)``:
    physical indices of the backend; dropped where the chip binds no device to a process group
    (CPU modules take none)."""
    if not torch.distributed.is_available():
        return
    from torch.nn.parallel import DistributedDataParallel

    def edit(values: dict) -> None:
        if not target.chip.binds_process_group_device:
            values.pop("device_ids", None)
            values.pop("output_device", None)
            return
        if values.get("device_ids") is not None:
            values["device_ids"] = [_device_index(target, d) for d in values["device_ids"]]
        if values.get("output_device") is not None:
            values["output_device"] = _device_index(target, values["output_device"])

    patcher.wrap_arguments(DistributedDataParallel, "__init__", edit)


@patch_function("barrier", on_cuda=True, waits_for="torch.distributed.distributed_c10d")
def patch_barrier(target: Target, patcher: Patcher) -> None:
    """``dist.barrier(device_ids=[local_rank])``: physical indices of the backend (torch puts the
    barrier's tensor on the accelerator device of the first id). An int that is the current
    device's own physical index (what the truthful ``torch.accelerator.current_device_index()``
    answers, as transformers passes it) is kept. Unchanged where the chip binds no device to a
    process group."""
    if not target.chip.binds_process_group_device:
        return
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    def physical(value: Any) -> Any:
        if value.__class__ is int and value == target.physical(target.current):
            return value
        return _device_index(target, value)

    def edit(values: dict) -> None:
        if isinstance(values.get("device_ids"), list):
            values["device_ids"] = [physical(d) for d in values["device_ids"]]

    original = c10d.barrier
    patcher.replace_in((c10d, dist), "barrier", original, with_edited_arguments(original, edit))


#: modules that take ``init_device_mesh`` by name from ``torch.distributed.device_mesh``; those
#: imported after the patch take the patched function (and get the original back on undo)
_MESH_OWNERS = ("torch.distributed.device_mesh", "torch.distributed", "torch.distributed.tensor",
                "torch.distributed.fsdp._fully_shard._fsdp_init")


@patch_function("device_mesh", on_cuda=True, waits_for="torch.distributed.device_mesh")
def patch_device_mesh(target: Target, patcher: Patcher) -> None:
    """``init_device_mesh("cuda", ...)`` and ``DeviceMesh("cuda", ...)``: a mesh of the
    backend's device type (FSDP2, DTensor and tensor parallelism take their device from it)."""
    if not torch.distributed.is_available():  # the module holds stubs that raise on use
        return
    if not compat.has("device_mesh"):
        return  # a torch without DeviceMesh
    from torch.distributed import device_mesh

    def edit(values: dict) -> None:
        values["device_type"] = target.translate_type(values["device_type"])

    original = device_mesh.init_device_mesh
    owners = [sys.modules.get(name) for name in _MESH_OWNERS]
    patcher.replace_in(owners, "init_device_mesh", original, with_edited_arguments(original, edit))
    patcher.wrap_arguments(device_mesh.DeviceMesh, "__init__", edit)


@patch_function("fsdp_device_id", on_cuda=True, waits_for="torch.distributed.fsdp")
def patch_fsdp_device_id(target: Target, patcher: Patcher) -> None:
    """FSDP1 ``FullyShardedDataParallel(module, device_id=N | "cuda:N" | torch.device("cuda", N))``:
    the backend's device (``cpu`` on the CPU backend, which FSDP1 takes with gloo). On a
    PrivateUse1 backend, FSDP1's move of the module's parameters and buffers to that device
    swaps their contents (``torch.utils.swap_tensors``, as ``Module._apply`` does there): a
    PrivateUse1 tensor cannot take over a CPU tensor's ``.data``."""
    from torch.distributed.fsdp import FullyShardedDataParallel, _init_utils

    def edit(values: dict) -> None:
        if values.get("device_id") is not None:
            values["device_id"] = target.translate(values["device_id"])

    patcher.wrap_arguments(FullyShardedDataParallel, "__init__", edit)
    if target.chip.dispatch_key == "PrivateUse1":
        patcher.wrap(_init_utils, "_move_states_to_device", _swapping_move)


def _swapping_move(original):
    def _move_states_to_device(params, buffers, device_from_device_id):
        if device_from_device_id is not None:
            with torch.no_grad():
                for param in params:
                    grad, param.grad = param.grad, None
                    moved = torch.nn.Parameter(param.to(device_from_device_id), param.requires_grad)
                    torch.utils.swap_tensors(param, moved)
                    if grad is not None:
                        param.grad = grad.to(device_from_device_id)
                for buffer in buffers:
                    torch.utils.swap_tensors(buffer, buffer.to(device_from_device_id))
        return original(params, buffers, None)

    return _move_states_to_device
