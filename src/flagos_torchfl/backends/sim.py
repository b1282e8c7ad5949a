"""The simulated accelerator (``flagos_torchfl.sim``) on PyTorch's PrivateUse1 key.

Registering it claims PrivateUse1 for the whole process, so it is never probed nor
auto-selected: ``detect`` lists it as available on request (``FL_BACKEND=sim``). Its devices
(``FL_SIM_DEVICES``) and native operator set (``FL_SIM_NATIVE_OPS``) are read here, once, when a
selection is made.
"""
from __future__ import annotations

import os
from types import MappingProxyType
from typing import Any, FrozenSet, Mapping, Optional

from .. import variables
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
    #: the process-group backend its collectives register under (``flagos_torchfl.sim.collectives``)
    collective = "simccl"
    low_precision_dtype = "bfloat16"
    supports_float64 = True
    priority = -1
    auto_selectable = False
    devices_env = "FL_SIM_DEVICES"
    enforces_memory_limit = True
    #: a Python PrivateUse1 backend cannot give torch a pinned-memory allocator (its C++ hooks
    #: interface is fixed): ``pin_memory()`` is a no-op and DataLoader does not pin
    pins_memory = False

    def probe(self, timeout=None, count_ops=True) -> ProbeResult:
        result = ProbeResult(backend=self.name, status="on-request")
        try:
            count = logical_device_count(self.devices_env)
        except ConfigError as exc:
            return ProbeResult(backend=self.name, status="unavailable", reason=str(exc))
        result.devices = [DeviceInfo(i, "flagos sim device", NOMINAL_MEMORY) for i in range(count)]
        result.notes.append("not probed: registering it claims PrivateUse1 for the process")
        return result

    def options(self, environ: Mapping[str, str] = os.environ) -> Mapping[str, Any]:
        """``native_ops``: the set ``FL_SIM_NATIVE_OPS`` names (ATen names, categories or
        friendly names of the semantic table, or a file such as one ``ops --export`` wrote),
        None for the default set."""
        spec = variables.read("FL_SIM_NATIVE_OPS", environ)
        if spec is None:
            return MappingProxyType({"native_ops": None})
        from .. import sim
        from ..aten import names

        return MappingProxyType({"native_ops": sim.parse_native_ops(spec, resolve_name=names.resolve_semantic)})

    def native_ops(self, options: Mapping[str, Any]) -> FrozenSet[str]:
        """The installed sim's set; before installation the set ``options`` describe."""
        from .. import sim
        from ..sim.native_ops import runtime_primitive_names

        if sim.is_installed():
            return sim.native_op_names()
        configured = options.get("native_ops")
        return sim.default_native_ops() if configured is None else configured | runtime_primitive_names()

    def start(self, selection):
        """Install the sim for ``selection``: its device count, memory limit and native set.
        Raises a clear error on a torch older than the sim needs or when another backend holds
        PrivateUse1."""
        import torch

        from .. import compat

        compat.require_torch("the sim backend", compat.SIM_MIN_TORCH, torch.__version__)
        from .. import sim
        from ..sim import registration

        owner = registration.current_owner()
        if owner is not None and not sim.is_installed():
            raise PrivateUse1ClaimedError(
                f"the sim backend needs PyTorch's PrivateUse1 slot, but {owner} holds it; "
                "run without that plugin, or select its backend instead"
            )
        count = selection.probe.device_count if selection.probe is not None else max(selection.devices) + 1
        limit = selection.memory_limit_bytes()
        if sim.is_installed():
            sim.set_memory_limit(limit)
        sim.install(num_devices=count, native_ops=selection.options["native_ops"], memory_limit=limit)
        self.start_collectives()
        return None

    def start_collectives(self) -> None:
        """Register the installed sim's collectives under :attr:`collective` for the device
        type the sim holds PrivateUse1 as (idempotent; nothing when torch has no distributed)."""
        import torch

        if not torch.distributed.is_available():
            return
        from ..sim import collectives

        collectives.register(torch._C._get_privateuse1_backend_name(), self.collective)

    def collective_staging(self) -> Optional[Mapping[str, int]]:
        """The staged collectives' counters (``flagos_torchfl.sim.collectives.stats``), once
        they are registered."""
        import torch

        if not torch.distributed.is_available():
            return None
        from ..sim import collectives

        return collectives.stats() if collectives.registered()[0] is not None else None
