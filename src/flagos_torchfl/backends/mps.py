"""Apple-silicon GPUs through Metal Performance Shaders (device ``mps``)."""
from __future__ import annotations

import platform
import sys

from .base import Backend, DeviceInfo, Unavailable


class MpsBackend(Backend):
    name = "mps"
    vendor = "Apple"
    aliases = ("apple", "metal")
    device_type = "mps"
    dispatch_key = "MPS"
    collective = "gloo"
    low_precision_dtype = "float16"
    supports_float64 = False
    priority = 60
    query_tool = ("sw_vers", "-productVersion")
    driver_pattern = r"(\d+(?:\.\d+)*)"

    def query_driver(self, timeout):
        if sys.platform != "darwin":
            return None, None
        return super().query_driver(timeout)

    def check_host(self, result, driver_problem):
        import torch

        if sys.platform != "darwin":
            raise Unavailable(f"MPS needs macOS on Apple silicon; this is {platform.system()}")
        if not torch.backends.mps.is_built():
            raise Unavailable("torch was built without MPS")
        if not torch.backends.mps.is_available():
            raise Unavailable("MPS is not available on this Mac")

    def list_devices(self, module, timeout):
        return [DeviceInfo(0, f"Apple {platform.machine()} GPU", module.recommended_max_memory())]
