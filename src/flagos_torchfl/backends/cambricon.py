"""Cambricon MLUs through torch_mlu (device ``mlu``)."""
from __future__ import annotations

from types import MappingProxyType

from .base import Backend, KubernetesDevices


class CambriconBackend(Backend):
    name = "cambricon"
    vendor = "Cambricon"
    aliases = ("mlu",)
    device_type = "mlu"
    dispatch_key = "PrivateUse1"
    collective = "cncl"
    low_precision_dtype = "float16"
    # float64 tensors are stored and computed as float32, with a warning (torch_mlu's
    # tensor_util.cpp): no float64 precision on the device
    supports_float64 = False
    priority = 85
    profiler_activity = "PrivateUse1"
    kernel_libraries = ("flaggems",)
    runs_triton = True
    # the device plugin with --enable-device-type names each model: cambricon.com/mlu370 ...
    kubernetes = KubernetesDevices(resources=("cambricon.com/mlu", "cambricon.com/mlu370"))
    plugin_module = "torch_mlu"
    query_tool = ("cnmon", "version")
    driver_pattern = r"[Dd]river\s*[:=]?\s*v?(\d[\w.\-]*)"
    visible_devices_env = "MLU_VISIBLE_DEVICES"
    # the device module's own names for CUDA graphs, pluggable allocators, ranges, the runtime API
    cuda_counterparts = MappingProxyType({"CUDAGraph": "MLUGraph", "CUDAPluggableAllocator": "MLUPluggableAllocator",
                                          "nvtx": "cnpx", "cudart": "cnrt"})
