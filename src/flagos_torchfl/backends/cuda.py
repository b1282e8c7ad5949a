"""NVIDIA GPUs through torch's own CUDA build."""
from __future__ import annotations

import os
import shutil
from types import MappingProxyType

from .base import Backend, KubernetesDevices, Unavailable
from ..machine.pools import TORCH_ALLOCATOR_VARIABLES


def nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or shutil.which("nvidia-smi") is not None


class CudaBackend(Backend):
    name = "cuda"
    vendor = "NVIDIA"
    aliases = ("nvidia", "gpu")
    device_type = "cuda"
    dispatch_key = "CUDA"
    collective = "nccl"
    low_precision_dtype = "bfloat16"
    supports_float64 = True
    priority = 100
    profiler_activity = "CUDA"
    kernel_libraries = ("flaggems",)
    runs_triton = True
    kubernetes = KubernetesDevices(resources=("nvidia.com/gpu",),
                                   probe_env=MappingProxyType({"NVIDIA_VISIBLE_DEVICES": "all"}))
    allocator_conf_env = TORCH_ALLOCATOR_VARIABLES
    query_tool = ("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")
    driver_pattern = r"(?m)^\s*(\d+\.\d+(?:\.\d+)?)\s*$"

    def driver_present(self) -> bool:
        return nvidia_driver_present()

    def check_host(self, result, driver_problem):
        import torch

        if not nvidia_driver_present():
            raise Unavailable("no NVIDIA driver found")
        if getattr(torch.version, "hip", None):
            raise Unavailable("torch was built for ROCm (HIP), not CUDA")
        if not getattr(torch.version, "cuda", None):
            raise Unavailable("torch was built without CUDA")

    def runtime_version(self, module):
        import torch

        return f"CUDA {torch.version.cuda}"
