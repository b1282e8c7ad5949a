"""The simulated accelerator (``flagos_torchfl.sim``) on PyTorch's PrivateUse1 key.

Registering it claims PrivateUse1 for the whole process, so it is never probed nor
auto-selected: ``detect`` lists it as available on request (``FL_BACKEND=sim``).
"""
from __future__ import annotations

import os

from ..errors import ConfigError, PrivateUse1ClaimedError
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
    enforces_memory_limit = True

    def probe(self, timeout=None, count_ops=True) -> ProbeResult:
        result = ProbeResult(backend=self.name, status="on-request")
        try:
            count = logical_device_count(self.devices_env)
        except ConfigError as exc:
            return ProbeResult(backend=self.name, status="unavailable", reason=str(exc))
        result.devices = [DeviceInfo(i, "flagos sim device", NOMINAL_MEMORY) for i in range(count)]
        result.notes.append("not probed: registering it claims PrivateUse1 for the process")
        return result

    def activate(self, selection):
        """Install the sim for ``selection``: its device count, its memory limit, and the native
        operators named by ``FL_SIM_NATIVE_OPS`` (ATen names, categories or friendly names of the
        semantic table, or a file such as one ``ops --export`` wrote). Raises a clear
        error on a torch older than the sim needs or when another backend holds PrivateUse1;
        returns the undo."""
        import torch

        from .. import compat

        compat.require_torch("the sim backend", compat.SIM_MIN_TORCH, torch.__version__)
        from .. import sim
        from ..routing import names
        from ..sim import registration

        owner = registration.current_owner()
        if owner is not None and not sim.is_installed():
            raise PrivateUse1ClaimedError(
                f"the sim backend needs PyTorch's PrivateUse1 slot, but {owner} holds it; "
                "run without that plugin, or select its backend instead"
            )
        spec = os.environ.get("FL_SIM_NATIVE_OPS", "").strip()
        native = sim.parse_native_ops(spec, resolve_name=names.resolve_semantic) if spec else None
        count = selection.probe.device_count if selection.probe is not None else max(selection.devices) + 1
        limit = selection.memory_limit_bytes()
        if sim.is_installed():
            sim.set_memory_limit(limit)
        sim.install(num_devices=count, native_ops=native, memory_limit=limit)
        return None

