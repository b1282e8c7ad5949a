"""Huawei Ascend NPUs through torch_npu (device ``npu``)."""
from __future__ import annotations

from types import MappingProxyType

from .base import Backend, KubernetesDevices


class AscendBackend(Backend):
    name = "ascend"
    vendor = "Huawei"
    aliases = ("npu", "huawei")
    device_type = "npu"
    dispatch_key = "PrivateUse1"
    collective = "hccl"
    # HCCL has no PREMUL_SUM: projects that run FSDP on Ascend rewrite it as SUM and a multiply
    # (ByteDance-Seed/VeOmni, veomni/ops/patch/hccl_premul_sum.py: "ReduceOp.PREMUL_SUM which is
    # not supported in Huawei HCCL")
    collective_lacks = ("PREMUL_SUM",)
    low_precision_dtype = "float16"  # torch_npu's autocast default; 910B also has bfloat16
    # no float64 kernels: torch_npu's transfer_to_npu turns DoubleTensor into FloatTensor and
    # its autocast excludes float64
    supports_float64 = False
    priority = 90
    profiler_activity = "PrivateUse1"
    kernel_libraries = ("flaggems",)
    runs_triton = True
    kubernetes = KubernetesDevices(resources=("huawei.com/Ascend910", "huawei.com/Ascend310P",
                                            "huawei.com/Ascend310"))
    allocator_conf_env = ("PYTORCH_NPU_ALLOC_CONF",)
    plugin_module = "torch_npu"
    query_tool = ("npu-smi", "info")
    driver_pattern = r"Version:\s*([\w.\-]+)"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    # the device module's own names for CUDA graphs, pluggable allocators, ranges, the runtime API
    cuda_counterparts = MappingProxyType({"CUDAGraph": "NPUGraph", "CUDAPluggableAllocator": "NPUPluggableAllocator",
                                          "nvtx": "mstx", "cudart": "npurt"})
