"""Apple-silicon GPUs through Metal Performance Shaders (device ``mps``)."""
from __future__ import annotations

import os
import platform
import sys

from .base import Backend, DeviceInfo, Unavailable
from ..machine.pools import DEVICE_POOL, NotApplied, PoolFigures
from ..selection_view import SelectionView


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

    def apply_memory_limit(self, selection: SelectionView):
        """``torch.mps.set_per_process_memory_fraction(limit / recommended_max_memory)`` (one
        device; at most 2.0, MPS's own bound); the undo puts MPS's default ratio back
        (``PYTORCH_MPS_HIGH_WATERMARK_RATIO``, else 1.7)."""
        import torch

        total = selection.device_memory(0)
        limit = selection.memory_limit_bytes(0)
        if not total or limit is None:
            raise NotApplied("the GPU's recommended memory size is unknown")
        torch.mps.set_per_process_memory_fraction(min(limit / total, 2.0))
        default = float(os.environ.get("PYTORCH_MPS_HIGH_WATERMARK_RATIO", "1.7"))
        return lambda: torch.mps.set_per_process_memory_fraction(default)

    def memory_figures(self, index: int) -> PoolFigures:
        """MPS's ``current_allocated_memory`` and ``driver_allocated_memory`` (as reserved); MPS
        keeps no peak nor allocation count."""
        import torch

        return PoolFigures(DEVICE_POOL, torch.mps.current_allocated_memory(),
                           torch.mps.driver_allocated_memory(), None, None, None,
                           torch.mps.recommended_max_memory())

    def synchronize(self, index: int) -> None:
        import torch

        torch.mps.synchronize()
