"""Intel GPUs through torch's XPU build (device ``xpu``)."""
from __future__ import annotations

from .base import Backend, KubernetesDevices, Unavailable


class XpuBackend(Backend):
    name = "xpu"
    vendor = "Intel"
    aliases = ("intel",)
    device_type = "xpu"
    dispatch_key = "XPU"
    collective = "xccl"
    low_precision_dtype = "bfloat16"
    supports_float64 = True
    priority = 70
    profiler_activity = "XPU"
    kernel_libraries = ("flaggems",)
    runs_triton = True
    kubernetes = KubernetesDevices(resources=("gpu.intel.com/i915", "gpu.intel.com/xe"))
    query_tool = ("xpu-smi", "discovery")
    driver_pattern = r"Driver Version\s*:\s*(\S+)"
    visible_devices_env = "ZE_AFFINITY_MASK"

    def driver_present(self) -> bool:
        import torch

        xpu = getattr(torch, "xpu", None)
        return xpu is not None and xpu._is_compiled()

    def check_host(self, result, driver_problem):
        if not self.driver_present():
            raise Unavailable("torch was built without XPU support")

    def runtime_version(self, module):
        import torch

        version = getattr(torch.version, "xpu", None)
        return f"XPU {version}" if version else None
