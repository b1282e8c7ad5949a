"""Moore Threads GPUs through torch_musa (device ``musa``)."""
from __future__ import annotations

from types import MappingProxyType

from .base import Backend, KubernetesDevices


class MThreadsBackend(Backend):
    name = "mthreads"
    vendor = "Moore Threads"
    aliases = ("musa", "moorethreads")
    device_type = "musa"
    dispatch_key = "PrivateUse1"
    collective = "mccl"
    low_precision_dtype = "float16"
    supports_float64 = False  # float64 only through an opt-in cast to float32
    priority = 80
    profiler_activity = "PrivateUse1"
    kernel_libraries = ("flaggems",)
    runs_triton = True
    kubernetes = KubernetesDevices(resources=("mthreads.com/gpu",))
    plugin_module = "torch_musa"
    query_tool = ("mthreads-gmi",)
    driver_pattern = r"Driver Version\s*:?\s*([\w.\-]+)"
    visible_devices_env = "MUSA_VISIBLE_DEVICES"
    # the device module's own names for CUDA graphs, pluggable allocators, ranges, the runtime API
    cuda_counterparts = MappingProxyType({"CUDAGraph": "MUSAGraph", "CUDAPluggableAllocator": "MUSAPluggableAllocator",
                                          "cudart": "musart"})
