"""The host CPU: always there, and the backend of last resort.

It presents ``FL_CPU_DEVICES`` logical devices, all on the host (default: ``LOCAL_WORLD_SIZE``
under torchrun, else 1), so multi-rank CUDA scripts can address ``cuda:1`` on a CPU-only machine.
"""
from __future__ import annotations

import os
import platform
from typing import Mapping, Optional

from ..errors import ConfigError
from .base import Backend, DeviceInfo, Unavailable, host_memory


def logical_device_count(variable: str, environ: Mapping[str, str] = os.environ) -> int:
    """``environ[variable]``, else ``LOCAL_WORLD_SIZE``, else 1; a positive int or ConfigError."""
    for name in (variable, "LOCAL_WORLD_SIZE"):
        raw = environ.get(name, "").strip()
        if raw:
            if not raw.isdigit() or int(raw) < 1:
                raise ConfigError(f"{name}={raw!r} is not valid: give a positive number of devices")
            return int(raw)
    return 1


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


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

    def load_runtime(self, timeout):
        import torch

        return torch.cpu

    def runtime_version(self, module) -> Optional[str]:
        import torch

        return f"torch {torch.__version__}"

    def list_devices(self, module, timeout):
        try:
            count = logical_device_count(self.devices_env)
        except ConfigError as exc:
            raise Unavailable(str(exc)) from None
        name, memory = cpu_name(), host_memory()
        return [DeviceInfo(i, name, memory) for i in range(count)]
