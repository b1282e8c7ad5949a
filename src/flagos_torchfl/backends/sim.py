"""The simulated accelerator (``flagos_torchfl.sim``) on PyTorch's PrivateUse1 key.

Registering it claims PrivateUse1 for the whole process, so it is never probed nor
auto-selected: ``detect`` lists it as available on request (``FL_BACKEND=sim``). Its devices
(``FL_SIM_DEVICES``), memory per device (``FL_SIM_DEVICE_MEMORY``), native operator set
(``FL_SIM_NATIVE_OPS``) and chip profile (``FL_SIM_PROFILE``, see :mod:`.profile`) are read here,
once, when a selection is made.
"""
from __future__ import annotations

import os
from types import MappingProxyType
from typing import Any, FrozenSet, Mapping, Optional, Tuple

from .. import variables
from ..errors import BackendUnavailableError, ConfigError, PrivateUse1ClaimedError
from .base import Backend, DeviceInfo, ProbeResult
from .cpu import logical_device_count
from ..selection_view import SelectionView

NOMINAL_MEMORY = 16 << 30


class SimBackend(Backend):
    name = "sim"
    vendor = "flagos (simulated)"
    aliases = ("simulated",)
    device_type = "sim"
    dispatch_key = "PrivateUse1"
    #: the process-group backend its collectives register under (``flagos_torchfl.sim.integration.collectives``)
    collective = "simccl"
    low_precision_dtype = "bfloat16"
    supports_float64 = True
    priority = -1
    profiler_activity = "PrivateUse1"
    auto_selectable = False
    devices_env = "FL_SIM_DEVICES"
    provides_deepspeed_accelerator = True  # profiles too: no vendor plugin for DeepSpeed to find

    @property
    def pins_at_allocation(self) -> bool:
        """With its C++ runtime, whose hooks give PyTorch a pinned host allocator; its Python
        guard cannot register one (factories then allocate and pin)."""
        from .. import sim

        return sim.runtime_kind() == "cpp"

    @property
    def resolves_unindexed_device(self) -> bool:
        """Without its C++ runtime: the Python device guard cannot follow ``set_device``, so
        ``"sim"`` without an index is resolved to the current device before it reaches torch."""
        from .. import sim

        return sim.runtime_kind() != "cpp"

    def probe(self, timeout=None, count_ops=True, query_tools=True, driver=None) -> ProbeResult:
        from .. import compat

        if not compat.has("python_privateuse1_backend"):
            import torch

            return ProbeResult(backend=self.name, status="unavailable",
                               reason=compat.sim_floor_reason(torch.__version__))
        result = ProbeResult(backend=self.name, status="on-request")
        try:
            count = logical_device_count(self.devices_env)
            memory = variables.read("FL_SIM_DEVICE_MEMORY") or NOMINAL_MEMORY
        except ConfigError as exc:
            return ProbeResult(backend=self.name, status="misconfigured", reason=str(exc))
        result.devices = [DeviceInfo(i, "flagos sim device", memory) for i in range(count)]
        result.notes.append("not probed: registering it claims PrivateUse1 for the process")
        from ..sim.runtime import cpp

        result.notes.append(cpp.status())
        return result

    def options(self, environ: Mapping[str, str] = os.environ) -> Mapping[str, Any]:
        """``native_ops``: the set ``FL_SIM_NATIVE_OPS`` names (ATen names, categories or
        friendly names of the semantic table, or a file such as one ``ops --export`` wrote), or
        the table of the chip ``FL_SIM_PROFILE`` names; None for the default set. ``profile``:
        that chip (None: none). ``device_memory``: ``FL_SIM_DEVICE_MEMORY`` (None: unset).
        ``runtime``: ``FL_SIM_RUNTIME`` (``auto``, ``cpp`` or ``python``)."""
        spec = variables.read("FL_SIM_NATIVE_OPS", environ)
        profile = variables.read("FL_SIM_PROFILE", environ)
        memory = variables.read("FL_SIM_DEVICE_MEMORY", environ)
        runtime = variables.read("FL_SIM_RUNTIME", environ)
        native = None
        if profile is not None:
            from ..tables.profile_specs import check_profile, native_set

            profile = check_profile(profile.strip().lower())  # a chip, or chip:model
            if spec is not None:
                raise ConfigError("FL_SIM_NATIVE_OPS and FL_SIM_PROFILE are both set: a profile brings "
                                  "its chip's native set; unset one (FL_OP_ROUTE adjusts single operators)")
            native = native_set(profile)
        elif spec is not None:
            from .. import sim
            from ..aten import names

            native = sim.parse_native_ops(spec, resolve_name=names.resolve_semantic)
        return MappingProxyType({"native_ops": native, "profile": profile, "device_memory": memory,
                                 "runtime": runtime})

    def profile_named(self, options: Mapping[str, Any]) -> Optional[str]:
        """The chip profile ``FL_SIM_PROFILE`` names (:mod:`.profile`), or None."""
        return options.get("profile") or None

    def device_memory(self, options: Mapping[str, Any]) -> Optional[int]:
        """Bytes per device the sim enforces when no memory limit is set (None: the sim's
        nominal 16 GiB)."""
        return options.get("device_memory")

    def supports_bfloat16(self) -> bool:
        """Whether the simulated chip computes bfloat16 (its ``is_bf16_supported()``): the plain
        sim does; a profile answers as its chip model."""
        return True

    def count_native_calls(self):
        """The sim times every native kernel call on the host: its Python kernels' and, with the
        C++ runtime, the C++ route's (counted in C++)."""
        from ..sim.integration.native_calls import NativeCalls

        return NativeCalls()

    def native_ops(self, options: Mapping[str, Any]) -> FrozenSet[str]:
        """The installed sim's set; before installation the set ``options`` describe."""
        from .. import sim
        from ..sim.operators.native_ops import runtime_primitive_names

        if sim.is_installed():
            return sim.native_op_names()
        configured = options.get("native_ops")
        return sim.default_native_ops() if configured is None else configured | runtime_primitive_names()

    def apply_memory_limit(self, selection: SelectionView):
        """Nothing more to do: :meth:`start` installs the sim with the limit, which its
        allocator enforces on every allocation (``torch.OutOfMemoryError`` past it)."""
        return None

    def start(self, selection: SelectionView):
        """Install the sim for ``selection``: its device count, memory limit and native set.
        Raises a clear error on a torch older than the sim needs or when another backend holds
        PrivateUse1."""
        import torch

        from .. import compat

        if not compat.has("python_privateuse1_backend"):
            raise BackendUnavailableError(self.name, compat.sim_floor_reason(torch.__version__))
        from .. import sim
        from ..sim.integration import registration

        owner = registration.current_owner()
        if owner is not None and not sim.is_installed():
            raise PrivateUse1ClaimedError(
                f"the sim backend needs PyTorch's PrivateUse1 slot, but {owner} holds it; "
                "run without that plugin, or select its backend instead"
            )
        count = selection.probe.device_count if selection.probe is not None else max(selection.devices) + 1
        limit = selection.memory_limit_bytes()
        if limit is None:
            limit = self.device_memory(selection.options)
        if sim.is_installed():
            sim.set_memory_limit(limit)
        name = selection.probe.devices[0].name if selection.probe is not None else None
        sim.install(num_devices=count, native_ops=selection.options["native_ops"], memory_limit=limit,
                    device_type=self.device_type, device_name=name, bfloat16=self.supports_bfloat16(),
                    runtime=selection.options.get("runtime", "auto"))
        self.start_collectives()
        return None

    def update_settings(self, old, new) -> None:
        """A new ``memory_virtual_limit`` takes effect at once (the allocator checks it)."""
        super().update_settings(old, new)
        from .. import sim

        if old.memory_limit_bytes() != new.memory_limit_bytes():
            sim.set_memory_limit(new.memory_limit_bytes())

    def start_collectives(self) -> None:
        """Register the installed sim's collectives under :attr:`collective` for the device
        type the sim holds PrivateUse1 as (idempotent; nothing when torch has no distributed)."""
        import torch

        if not torch.distributed.is_available():
            return
        from ..sim.integration import collectives

        collectives.register(torch._C._get_privateuse1_backend_name(), self.collective)

    def dynamo_device_interface(self) -> Optional[type]:
        """The sim's (``sim/integration/inductor.py``): dynamo asks for it before Inductor first compiles."""
        from ..sim.integration import inductor

        return inductor.interface_class()

    def runtime_python_modules(self) -> Tuple[str, ...]:
        """The sim's kernels, storages, allocator, device guard, collectives and device state:
        PyTorch's C++ side calls them as a chip's runtime (``torch.sim``'s functions, which
        programs call, are not among them: dynamo traces those as it does ``torch.cuda``'s)."""
        return tuple(f"flagos_torchfl.sim.{name}" for name in (
            "operators.kernels", "runtime.tensors", "runtime.allocator", "integration.registration",
            "integration.collectives", "runtime.state", "integration.torch_patches"))

    def runs_premul_sum_at_entry(self) -> bool:
        """True unless the chip the sim answers as lacks PREMUL_SUM (:attr:`collective_lacks`:
        an Ascend profile, as HCCL): the staged collectives run on gloo, which has no
        PREMUL_SUM, and the ``c10d`` operator hands a kernel the reduce op without its factor."""
        return "PREMUL_SUM" not in self.collective_lacks

    def collective_staging(self) -> Optional[Mapping[str, int]]:
        """The staged collectives' counters (``flagos_torchfl.sim.integration.collectives.stats``), once
        they are registered."""
        import torch

        if not torch.distributed.is_available():
            return None
        from ..sim.integration import collectives

        return collectives.stats() if collectives.registered()[0] is not None else None
