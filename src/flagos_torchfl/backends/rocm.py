"""AMD GPUs through torch's ROCm (HIP) build, whose device type is ``cuda``."""
from __future__ import annotations

import os
import shutil

from .base import Backend, KubernetesDevices, Unavailable
from ..machine.pools import TORCH_ALLOCATOR_VARIABLES


class RocmBackend(Backend):
    name = "rocm"
    vendor = "AMD"
    aliases = ("hip", "amd")
    device_type = "cuda"
    dispatch_key = "CUDA"
    collective = "nccl"  # RCCL, reached under the name "nccl"
    low_precision_dtype = "bfloat16"
    supports_float64 = True
    priority = 95
    profiler_activity = "CUDA"
    kernel_libraries = ("flaggems",)
    runs_triton = True
    kubernetes = KubernetesDevices(resources=("amd.com/gpu",))
    allocator_conf_env = TORCH_ALLOCATOR_VARIABLES
    query_tool = ("rocm-smi", "--showdriverversion")
    driver_pattern = r"[Dd]river version:\s*([\w.\-]+)"

    def driver_present(self) -> bool:
        return os.path.exists("/dev/kfd") or shutil.which("rocm-smi") is not None

    def check_host(self, result, driver_problem):
        import torch

        if not self.driver_present():
            raise Unavailable("no AMD ROCm driver found")
        if not getattr(torch.version, "hip", None):
            raise Unavailable("torch was built without ROCm (HIP)")

    def runtime_version(self, module):
        import torch

        return f"HIP {torch.version.hip}"
