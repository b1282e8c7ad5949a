"""The host CPU: always there, and the backend of last resort.

It presents ``FL_CPU_DEVICES`` logical devices, all on the host (default: ``LOCAL_WORLD_SIZE``
under torchrun, else 1), so multi-rank CUDA scripts can address ``cuda:1`` on a CPU-only machine.
``torch.cuda`` is answered by :class:`~.host.HostRuntime`: streams run inline, events record
host time, ``mem_get_info`` reads host memory, the one CPU generator serves every device.
"""
from __future__ import annotations

import os
from typing import Mapping, Optional

from .. import variables
from ..errors import ConfigError
from .base import Backend, DeviceInfo
from .host import HostRuntime, cpu_name, host_memory


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
