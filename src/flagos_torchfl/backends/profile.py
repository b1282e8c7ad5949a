"""Sim profiles: the sim runtime answering as one chip (``FL_BACKEND=sim FL_SIM_PROFILE=ascend``,
or ``run --profile ascend``), and as one model of it (``ascend:910a``; the chip alone is its
default model, :mod:`.chip_models`).

A profile is a :class:`ProfileBackend`: a sim backend whose answers are the chip's. Its native
operator set is the vendor's published table (``data/chips/<chip>.json``, :mod:`.op_tables`), and
every trait comes from the chip's own :class:`~.base.Backend` declaration (never copied here):
device type, collective, low-precision dtype, float64 support, visible-devices variable, and the
common part's name and memory per device. Only the runtime is the sim's.

- The simulated device takes the chip's device type name (``npu``, ``mlu``, ``musa``) so that
  ``torch.npu``, ``.npu()``, ``device="npu"`` and this package's paths for that chip run as on the
  chip. PyTorch's PrivateUse1 slot has one name per process; when it cannot take the chip's
  (:func:`rename_problem`), the device stays ``sim`` and the profile says so.
- A chip without float64 gets a dtype gap for float64 on every native compute operator: such
  calls are routed (and reported), while float64 tensors can still be created, filled, copied
  and read (the runtime primitives and :data:`MEMORY_ONLY` keep their native kernels).
- Sparse and quantized tensors on the device are served as the chip's plugin registers kernels
  for them (:meth:`ProfileBackend.tensor_kinds`, ``data/tensor_kinds.json``): an overload the
  plugin has no kernel for on the device's sparse or quantized key is refused with the
  dispatcher's words for a missing kernel (``... from the 'Sparsenpu' backend``).
- Devices: ``<visible-devices variable>`` (e.g. ``ASCEND_RT_VISIBLE_DEVICES=0,1``, or
  ``CUDA_VISIBLE_DEVICES`` copied to it as on the chip) gives the visible ones, else
  ``FL_SIM_DEVICES`` / ``LOCAL_WORLD_SIZE`` / 1. Memory per device: ``FL_SIM_DEVICE_MEMORY``, else
  the model's; the sim enforces it (``torch.OutOfMemoryError``).
"""
from __future__ import annotations

import os
from types import MappingProxyType
from typing import Dict, FrozenSet, List, Mapping, Optional, Tuple

from .. import variables
from ..errors import ConfigError
from ..tables import chip_models, op_tables
from ..tables.profile_specs import native_set, rename_problem, tensor_kinds
from ..machine import visible as _visible
from .base import Backend, DeviceInfo, ProbeResult
from .cpu import logical_device_count
from .sim import SimBackend
from ..selection_view import SelectionView


#: operators that only allocate or fill memory: a chip without float64 arithmetic still holds
#: float64 tensors, so these (and the runtime primitives: copies, views, fill_) are not routed
MEMORY_ONLY = frozenset({
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "zeros", "zeros_like",
    "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full", "scalar_tensor",
})


class ProfileBackend(SimBackend):
    """The sim runtime with ``chip``'s answers, as its ``model`` (see the module docstring)."""

    def __init__(self, chip: Backend, model: chip_models.ChipModel):
        self.chip = chip
        self.model = model
        self.profile = chip.name
        self.table = op_tables.load(chip.name)
        self.name = f"sim-{chip.name}"
        self.vendor = f"{chip.vendor} (simulated)"
        self.aliases = ()
        self.rename_problem = rename_problem(chip.device_type)
        self.device_type = "sim" if self.rename_problem else chip.device_type
        self.collective = chip.collective
        self.collective_lacks = chip.collective_lacks
        self.low_precision_dtype = chip.low_precision_dtype
        self.supports_float64 = chip.supports_float64
        self.visible_devices_env = chip.visible_devices_env
        self.kernel_libraries = chip.kernel_libraries
        self.cuda_counterparts = chip.cuda_counterparts
        self.supports_tf32 = model.tf32
        self.dtype_gaps = self._dtype_gaps()

    def device_module_table(self):
        """The chip's device-module table: ``torch.cuda`` answers as the chip's module would."""
        return self.chip.device_module_table()

    def cuda_environment(self):
        """The chip's: a program on the profile sees the variables its chip's runtime reads."""
        return self.chip.cuda_environment()

    def _dtype_gaps(self) -> Mapping[str, Tuple[str, ...]]:
        gaps: Dict[str, Tuple[str, ...]] = dict(self.chip.dtype_gaps)
        if not self.chip.supports_float64:
            from ..sim.operators.native_ops import runtime_primitive_names

            compute = {n for n in native_set(self.profile) - runtime_primitive_names()
                       if n[len("aten::"):].partition(".")[0] not in MEMORY_ONLY}
            gaps["float64"] = tuple(sorted(set(gaps.get("float64", ())) | compute))
        return MappingProxyType(gaps)

    # ----------------------------------------------------------------- devices
    def visible_devices(self, environ: Mapping[str, str] = os.environ) -> int:
        """How many devices are visible: the entries of the chip's visible-devices variable
        when set (each below ``FL_SIM_DEVICES`` when that is set), else ``FL_SIM_DEVICES`` /
        ``LOCAL_WORLD_SIZE`` / 1. Raises ConfigError for a malformed mask."""
        mask = environ.get(self.visible_devices_env) if self.visible_devices_env else None
        if mask is None:
            return logical_device_count(self.devices_env, environ)
        entries = [e.strip() for e in mask.split(",") if e.strip()]
        node = variables.read(self.devices_env, environ)
        limit = node if node is not None else variables.MAX_DEVICES
        if not all(e.isascii() and e.isdigit() and int(e) < limit for e in entries) \
                or len(set(entries)) != len(entries):
            raise ConfigError(f"{self.visible_devices_env}={mask!r} is not valid: give distinct device "
                              f"numbers below {limit}, e.g. `0,1`")
        return len(entries)

    def probe(self, timeout=None, count_ops=True) -> ProbeResult:
        """Available on request, with the chip's part name and memory per device; the chip's
        visible-devices variable (or ``CUDA_VISIBLE_DEVICES``, copied to it as on the chip)
        chooses how many devices are visible."""
        result = ProbeResult(backend=self.name, status="on-request")
        try:
            with _visible.translated(self.visible_devices_env):
                count = self.visible_devices()
            memory = variables.read("FL_SIM_DEVICE_MEMORY") or self.model.memory
        except ConfigError as exc:
            return ProbeResult(backend=self.name, status="unavailable", reason=str(exc))
        if count == 0:
            return ProbeResult(backend=self.name, status="unavailable",
                               reason=f"0 devices visible ({self.visible_devices_env} is empty)")
        result.devices = [DeviceInfo(i, f"{self.model.device_name} (flagos sim)", memory) for i in range(count)]
        result.notes.extend(self.notes())
        if count_ops:
            result.native_ops = len(native_set(self.profile))
        return result

    def notes(self) -> List[str]:
        """What a user should know about this profile in this process."""
        source = self.table.source
        origin = source.get("package") or source.get("repository")
        version = source.get("version") or source.get("ref")
        notes = [f"profile of {self.profile}, model {self.model.name}: operator table of {origin} {version}"]
        if self.rename_problem:
            notes.append(f"device type stays 'sim', not {self.chip.device_type!r}: {self.rename_problem}")
        return notes

    def device_memory(self, options: Mapping[str, object]) -> Optional[int]:
        """Bytes per device the sim enforces: ``FL_SIM_DEVICE_MEMORY``, else the model's."""
        return options.get("device_memory") or self.model.memory

    def supports_bfloat16(self) -> bool:
        """The model's: its plugin's ``is_bf16_supported()`` on it."""
        return self.model.bfloat16

    def tensor_kinds(self) -> Optional[Mapping[str, FrozenSet[str]]]:
        """Per sparse and quantized dispatch key of the device (``SparsePrivateUse1``,
        ``SparseCsrPrivateUse1``, ``QuantizedPrivateUse1``), the overloads the chip's plugin
        registers a kernel for: the profile serves those where the sim can and refuses the rest
        as the plugin's build does (None: the chip's are not known, and the sim serves all)."""
        return tensor_kinds(self.chip.name)

    def start(self, selection: SelectionView):
        from .. import sim

        sim.limit_tensor_kinds(self.tensor_kinds())
        if self.rename_problem:
            from ..log import get_logger

            get_logger("backends").warning(
                "sim profile %s: the device type stays 'sim' instead of %r: %s", self.profile,
                self.chip.device_type, self.rename_problem)
        return super().start(selection)

    def describe(self) -> dict:
        return {**super().describe(), "profile": self.profile, "model": self.model.name,
                "table": dict(self.table.source), "rename_problem": self.rename_problem}
