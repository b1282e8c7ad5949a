"""The simulated accelerator (``flagos_torchfl.sim``) on PyTorch's PrivateUse1 key.

Registering it claims PrivateUse1 for the whole process, so it is never probed nor
auto-selected: ``detect`` lists it as available on request (``FL_BACKEND=sim``).
"""
from __future__ import annotations

from ..errors import ConfigError
from .base import Backend, DeviceInfo, ProbeResult
from .cpu import logical_device_count

NOMINAL_MEMORY = 16 << 30


class SimBackend(Backend):
    name = "sim"
    vendor = "flagos (simulated)"
    aliases = ("simulated",)
    device_type = "sim"
    dispatch_key = "PrivateUse1"
    collective = "gloo"
    low_precision_dtype = "bfloat16"
    supports_float64 = True
    priority = -1
    auto_selectable = False
    devices_env = "FL_SIM_DEVICES"

    def probe(self, timeout=None, count_ops=True) -> ProbeResult:
        result = ProbeResult(backend=self.name, status="on-request")
        try:
            count = logical_device_count(self.devices_env)
        except ConfigError as exc:
            return ProbeResult(backend=self.name, status="unavailable", reason=str(exc))
        result.devices = [DeviceInfo(i, "flagos sim device", NOMINAL_MEMORY) for i in range(count)]
        result.notes.append("not probed: registering it claims PrivateUse1 for the process")
        return result
