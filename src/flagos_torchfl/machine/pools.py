"""A chip's memory as the layers above see it: one device's pool figures in one shape
(:class:`PoolFigures`), the per-process cap through the device module's
``set_per_process_memory_fraction``, and the allocator setting read when the runtime starts.

The functions take the device module (``torch.cuda``, ``torch.npu``, ``torch.sim``, the host
runtime) and physical device indices; :class:`~flagos_torchfl.backends.base.Backend` methods call them for their chip.
"""
from __future__ import annotations

import dataclasses
import os
import types
from typing import Any, Callable, Mapping, MutableMapping, Optional, Sequence, Tuple

from .. import compat, variables

#: what ``PoolFigures.measures`` says for a caching allocator's own figures
DEVICE_POOL = "device pool"
#: the allocator option ``FL_EXPANDABLE_SEGMENTS=1`` adds to the chip's allocator variable
EXPANDABLE = "expandable_segments:True"
#: what torch's own caching allocator (CUDA, ROCm) reads, in order: ``PYTORCH_ALLOC_CONF`` and
#: then the deprecated ``PYTORCH_CUDA_ALLOC_CONF``, or only the latter (compat ``alloc_conf_variable``)
TORCH_ALLOCATOR_VARIABLES = (("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
                             if compat.has("alloc_conf_variable") else ("PYTORCH_CUDA_ALLOC_CONF",))


class NotApplied(Exception):
    """A setting the chip cannot apply; ``reason`` says why (the activation warning shows it)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class PoolFigures:
    """One device's memory in bytes; None where the chip does not say (never a made-up 0).
    ``measures`` labels the figures: :data:`DEVICE_POOL` for a caching allocator's figures,
    ``"host process (resident memory)"`` where the host stands in for the device."""

    measures: str
    allocated: Optional[int]
    reserved: Optional[int]
    #: peak of ``allocated`` since start or the last ``reset_peak_memory_stats``
    peak: Optional[int]
    #: bytes reserved but not allocated: free blocks the pool keeps for reuse
    cached: Optional[int]
    #: live allocations (blocks handed out)
    allocations: Optional[int]
    #: the device's memory
    total: Optional[int]


def real(module: Any, name: str) -> Optional[Callable[..., Any]]:
    """``module.<name>`` read past any facade the module object wears (so ``torch.cuda`` answers
    with physical indices while the redirection renumbers devices); None when absent."""
    try:
        if isinstance(module, types.ModuleType):
            return types.ModuleType.__getattribute__(module, name)
        return getattr(module, name)
    except AttributeError:
        return None


def module_figures(module: Any, index: int) -> PoolFigures:
    """The device-pool figures of device ``index`` from the module's ``memory_allocated``,
    ``memory_reserved``, ``max_memory_allocated``, ``memory_stats`` and device properties."""
    def ask(name: str) -> Any:
        fn = real(module, name)
        return None if fn is None else fn(index)

    allocated, reserved = ask("memory_allocated"), ask("memory_reserved")
    cached = None if allocated is None or reserved is None else reserved - allocated
    stats = ask("memory_stats") or {}
    props = ask("get_device_properties")
    return PoolFigures(DEVICE_POOL, allocated, reserved, ask("max_memory_allocated"), cached,
                       stats.get("allocation.all.current"), getattr(props, "total_memory", None))


def fraction_limit(module: Any, module_name: str, limits: Mapping[int, int],
                   totals: Mapping[int, Optional[int]]) -> Callable[[], None]:
    """Cap device ``i``'s pool at ``limits[i]`` bytes through
    ``module.set_per_process_memory_fraction(limits[i] / totals[i], i)`` (at most 1.0); the
    undo sets 1.0 again (no cap). Raises :class:`NotApplied` when the module has no such
    function or a device's total memory is unknown."""
    setter = real(module, "set_per_process_memory_fraction")
    if setter is None:
        raise NotApplied(f"{module_name} has no set_per_process_memory_fraction")
    unknown = [i for i in limits if not totals.get(i)]
    if unknown:
        raise NotApplied(f"the total memory of device {unknown[0]} is unknown, so the limit "
                         "cannot be given as a fraction of it")
    done = []
    for index, limit in limits.items():
        setter(min(limit / totals[index], 1.0), index)
        done.append(index)

    def undo() -> None:
        for i in done:
            setter(1.0, i)
    return undo


def add_allocator_option(variables_read: Sequence[str],
                         environ: MutableMapping[str, str] = os.environ) -> Optional[Tuple[str, str]]:
    """With ``FL_EXPANDABLE_SEGMENTS=1``, add :data:`EXPANDABLE` to the allocator variable the
    chip reads: the first of ``variables_read`` that is set (a user's own options stay the ones
    read), else the first. Unchanged when it already names ``expandable_segments``. Call before
    the runtime starts, since allocators read it once. Returns ``(variable, new value)`` when it
    changed one, else None."""
    if not variables_read or not variables.read("FL_EXPANDABLE_SEGMENTS", environ):
        return None
    variable = next((name for name in variables_read if environ.get(name, "").strip()), variables_read[0])
    current = environ.get(variable, "").strip()
    if "expandable_segments" in current:
        return None
    environ[variable] = f"{current},{EXPANDABLE}" if current else EXPANDABLE
    return variable, environ[variable]
