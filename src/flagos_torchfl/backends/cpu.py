"""The host CPU: always there, and the backend of last resort.

It presents ``FL_CPU_DEVICES`` logical devices, all on the host (default: ``LOCAL_WORLD_SIZE``
under torchrun, else 1), so multi-rank CUDA scripts can address ``cuda:1`` on a CPU-only machine.
``torch.cuda`` is answered by :class:`~.host.HostRuntime`: streams run inline, events record
host time, ``mem_get_info`` reads host memory, memory counters give the process's resident
memory, the one CPU generator serves every device.

``memory_virtual_limit`` cannot cap allocations here: the host has no device pool, and
``RLIMIT_AS``/``RLIMIT_DATA`` would cap address space (thread stacks, libraries, allocator
reservations), failing unrelated allocations in this process and its children. It is a checked
limit instead: after every optimizer step the process's resident memory is compared with it,
and ``torch.OutOfMemoryError`` is raised past it.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from .. import compat, optimizer_steps, variables
from ..config import format_bytes
from ..errors import ConfigError
from ..log import get_logger
from .base import Backend, DeviceInfo
from ..machine.host import HostRuntime, cpu_name, host_memory, process_memory
from ..machine.pools import NotApplied, PoolFigures
from ..selection_view import SelectionView

log = get_logger("backends")
#: what the cpu backend's memory figures measure
RESIDENT = "host process (resident memory)"


def logical_device_count(variable: str, environ: Mapping[str, str] = os.environ) -> int:
    """``environ[variable]``, else ``FL_DEVICES``, else ``LOCAL_WORLD_SIZE``, else 1; a device
    count or ConfigError."""
    for name in (variable, "FL_DEVICES"):
        count = variables.read(name, environ)
        if count is not None:
            return count
    local = environ.get("LOCAL_WORLD_SIZE", "").strip()
    if local:
        if not (local.isascii() and local.isdigit()) or not 1 <= int(local) <= variables.MAX_DEVICES:
            raise ConfigError(f"LOCAL_WORLD_SIZE={local!r} is not valid: give a number of devices "
                              f"from 1 to {variables.MAX_DEVICES}, or set {variable}")
        return int(local)
    return 1


class CpuBackend(Backend):
    name = "cpu"
    vendor = "host"
    aliases = ("host",)
    device_type = "cpu"
    dispatch_key = "CPU"
    collective = "gloo"
    low_precision_dtype = "bfloat16"
    supports_float64 = True
    priority = 0
    devices_env = "FL_CPU_DEVICES"
    pins_memory = False  # no device to pin host memory for
    binds_process_group_device = False
    routes_operators = False  # the host runs every operator PyTorch has
    provides_deepspeed_accelerator = True  # DeepSpeed's CPU accelerator knows no logical devices

    def load_runtime(self, timeout):
        import torch

        return torch.cpu

    def runtime_version(self, module) -> Optional[str]:
        import torch

        return f"torch {torch.__version__}"

    def list_devices(self, module, timeout):
        count = logical_device_count(self.devices_env)  # a ConfigError: probe says misconfigured
        name, memory = cpu_name(), host_memory()
        return [DeviceInfo(i, name, memory) for i in range(count)]

    def torch_device(self, index=None):
        """Every logical device is the host: ``torch.device("cpu")``."""
        import torch

        return torch.device("cpu")

    def device_module(self) -> HostRuntime:
        return HostRuntime()

    def runs_premul_sum_at_entry(self) -> bool:
        """True: the CUDA program's ``"nccl"`` is gloo here, which refuses PREMUL_SUM ("Cannot
        use ReduceOp.PREMUL_SUM with Gloo") where NCCL has it; FSDP2's
        ``set_gradient_divide_factor`` (torchtitan sets it) reduce-scatters with it."""
        return True

    def apply_memory_limit(self, selection: SelectionView):
        """A checked limit: after every optimizer step (:mod:`..optimizer_steps`)
        the process's resident memory is compared with the limit and ``torch.OutOfMemoryError``
        raised past it. Warns once per activation that allocations themselves are not capped."""
        limit = selection.memory_limit_bytes(0)
        if limit is None:
            raise NotApplied("the host's memory size is unknown, so a fraction of it cannot be resolved")
        log.warning("memory_virtual_limit=%s on backend cpu: the host has no device pool to cap, "
                    "so the process's resident memory is checked against it after every "
                    "optimizer step (torch.OutOfMemoryError past it), not at each allocation",
                    format_bytes(limit))

        def check(optimizer):
            resident, peak = process_memory()
            if resident > limit:
                raise compat.out_of_memory_error()(
                    f"cpu backend: the process's resident memory {format_bytes(resident)} "
                    f"(peak {format_bytes(peak)}) exceeds memory_virtual_limit "
                    f"{format_bytes(limit)} after an optimizer step. To fit: lower the batch "
                    "size or the model's size, free tensors kept between steps, or raise "
                    "memory_virtual_limit (FL_MEMORY_VIRTUAL_LIMIT).")
        return optimizer_steps.after_each_step(check)

    def memory_figures(self, index: int) -> PoolFigures:
        """The process's resident memory (as ``allocated`` and ``reserved``) and its peak; no
        cached bytes nor allocation count (the host keeps no pool to count them)."""
        resident, peak = process_memory()
        return PoolFigures(RESIDENT, resident, resident, peak, None, None, host_memory())
