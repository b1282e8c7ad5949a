"""Memory-pool control on the active backend: the activation step for ``memory_virtual_limit``
and ``memory_pool_clear_interval``, ``ft.memory_stats`` / ``ft.memory_summary`` in one schema on
every backend, ``ft.memory_pool_defrag``, and the advice out-of-memory errors carry.

Each chip states its own mechanism through its :class:`~.backends.Backend`
(``apply_memory_limit``, ``memory_figures``, ``release_cached_memory``, ``synchronize``,
``allocator_conf_env``); this module decides when to call them.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional

from . import active, optimizer_steps, variables
from .machine.pools import NotApplied
from .config import format_bytes
from .log import get_logger
from .selection_view import SelectionView

log = get_logger("memory")


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """One device's memory, the same fields on every backend (bytes; None: not known there,
    never a made-up 0). ``measures`` says what the figures are: ``"device pool"`` (the chip's
    caching allocator) or ``"host process (resident memory)"`` on the cpu backend, where
    ``allocated`` and ``reserved`` are the process's resident memory and ``peak`` its peak."""

    backend: str
    #: the logical device (``cuda:<device>`` in user code)
    device: int
    measures: str
    allocated: Optional[int]
    reserved: Optional[int]
    #: peak of ``allocated`` since start or the last ``torch.cuda.reset_peak_memory_stats()``
    peak: Optional[int]
    #: reserved but unallocated: free blocks the pool keeps for reuse
    cached: Optional[int]
    #: ``memory_virtual_limit`` resolved for this device (None: no limit set)
    limit: Optional[int]
    #: live allocations
    allocations: Optional[int]
    #: the device's memory
    total: Optional[int]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Defrag:
    """What :func:`memory_pool_defrag` did on one device."""

    before: MemoryStats
    after: MemoryStats

    @property
    def released(self) -> Optional[int]:
        """Bytes the pool gave back (reserved before minus after)."""
        if self.before.reserved is None or self.after.reserved is None:
            return None
        return self.before.reserved - self.after.reserved


def _active():
    selection = active.current()
    if selection is None:
        raise RuntimeError("no backend is active: call ft.init_backend() or ft.auto_select_backend() first")
    return selection


def _logical(selection: SelectionView, device: Any) -> int:
    """The logical index ``device`` names: None (the current device), an int, ``"cuda:N"``,
    ``"<device type>:N"`` or a ``torch.device``; ValueError for another."""
    if device is None:
        current = getattr(selection.chip.device_module(), "current_device", None)
        physical = current() if current is not None else selection.devices[0]
        return selection.devices.index(physical) if physical in selection.devices else 0
    import torch

    index = device
    if isinstance(device, (str, torch.device)):
        parsed = torch.device(device) if isinstance(device, str) else device
        if parsed.type not in ("cuda", selection.device_type):
            raise ValueError(f"device {device!r} is not a device of backend {selection.backend!r}: "
                             f"give an index, 'cuda:N' or '{selection.device_type}:N'")
        index = parsed.index or 0
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(selection.devices):
        raise ValueError(f"device {device!r} is not valid: backend {selection.backend!r} has "
                         f"{len(selection.devices)} device(s), indices 0..{len(selection.devices) - 1}")
    return index


def _stats(selection: SelectionView, logical: int) -> MemoryStats:
    figures = selection.chip.memory_figures(selection.devices[logical])
    return MemoryStats(selection.backend, logical, figures.measures, figures.allocated,
                       figures.reserved, figures.peak, figures.cached,
                       selection.memory_limit_bytes(logical), figures.allocations, figures.total)


def memory_stats(device: Any = None) -> MemoryStats:
    """The memory of one device of the active backend (None: the current device)."""
    selection = _active()
    return _stats(selection, _logical(selection, device))


def _cell(value: Optional[int]) -> str:
    return "-" if value is None else format_bytes(value)


def memory_summary() -> str:
    """A table of :func:`memory_stats` for every selected device, saying what it measures."""
    selection = _active()
    rows = [_stats(selection, i) for i in range(len(selection.devices))]
    head = ("device", "allocated", "reserved", "cached", "peak", "limit", "total", "allocations")
    body = [(f"cuda:{r.device}", _cell(r.allocated), _cell(r.reserved), _cell(r.cached),
             _cell(r.peak), _cell(r.limit), _cell(r.total),
             "-" if r.allocations is None else str(r.allocations)) for r in rows]
    widths = [max(len(str(line[i])) for line in (head, *body)) for i in range(len(head))]
    lines = [f"memory of backend {selection.backend} ({rows[0].measures}; '-': not known there)"]
    lines += ["  ".join(str(c).rjust(w) for c, w in zip(line, widths)) for line in (head, *body)]
    return "\n".join(lines) + "\n"


def memory_pool_defrag() -> List[Defrag]:
    """Synchronise every selected device, give the pool's cached blocks back (the chip's
    ``empty_cache``; on the cpu backend the C heap's free pages, glibc ``malloc_trim``) and
    return each device's figures before and after."""
    selection = _active()
    devices = range(len(selection.devices))
    for i in devices:
        selection.chip.synchronize(selection.devices[i])
    before = [_stats(selection, i) for i in devices]
    selection.chip.release_cached_memory()
    return [Defrag(b, _stats(selection, i)) for i, b in zip(devices, before)]


def clear_every(interval: int, release: Callable[[], None]) -> Callable[[], None]:
    """Call ``release`` after every ``interval``-th optimizer step of the process (each
    outermost ``step`` counts: :mod:`.optimizer_steps`); returns the undo."""
    steps = [0]

    def hook(optimizer) -> None:
        steps[0] += 1
        if steps[0] % interval == 0:
            release()
            log.debug("memory pool cleared after optimizer step %d", steps[0])
    return optimizer_steps.after_each_step(hook)


def activate(selection: SelectionView) -> Optional[Callable[[], None]]:
    """Activation step: apply ``memory_virtual_limit`` through the chip's mechanism (a warning
    says why where it cannot) and ``memory_pool_clear_interval``; say where
    ``FL_EXPANDABLE_SEGMENTS=1`` has no allocator to act on. Returns the undo."""
    chip, settings = selection.chip, selection.settings
    undos: List[Callable[[], None]] = []
    if settings.memory_virtual_limit is not None:
        try:
            undo = chip.apply_memory_limit(selection)
        except NotApplied as exc:
            log.warning("memory_virtual_limit=%s not applied on backend %s: %s",
                        settings.memory_virtual_limit, chip.name, exc.reason)
        else:
            if undo is not None:
                undos.append(undo)
    if settings.memory_pool_clear_interval is not None:
        undos.append(clear_every(settings.memory_pool_clear_interval, chip.release_cached_memory))
    if variables.read("FL_EXPANDABLE_SEGMENTS") and not chip.allocator_conf_env:
        log.warning("FL_EXPANDABLE_SEGMENTS=1 not applied on backend %s: it has no allocator "
                    "option for expandable segments that this package knows", chip.name)
    if not undos:
        return None

    def undo_all() -> None:
        for step in reversed(undos):
            step()
    return undo_all


def oom_advice(selection: SelectionView, stats: MemoryStats) -> str:
    """The pool figures of ``stats`` and what to change, for an out-of-memory error."""
    settings, chip = selection.settings, selection.chip
    figures = (f"backend {selection.backend}, cuda:{stats.device} ({stats.measures}): "
               f"{_cell(stats.allocated)} allocated, {_cell(stats.reserved)} reserved, "
               f"{_cell(stats.cached)} cached, peak {_cell(stats.peak)}, "
               f"limit {_cell(stats.limit)}, total {_cell(stats.total)}")
    advice = ["lower the batch size (or sequence length)"]
    if stats.limit is not None:
        advice.append(f"raise memory_virtual_limit (now {settings.memory_virtual_limit}; "
                      "FL_MEMORY_VIRTUAL_LIMIT)")
    if stats.cached and stats.reserved and stats.cached > stats.reserved // 10:
        interval = settings.memory_pool_clear_interval
        advice.append(f"{_cell(stats.cached)} are cached free blocks: call ft.memory_pool_defrag() "
                      f"or set memory_pool_clear_interval (now {interval})")
    if chip.allocator_conf_env and not variables.read("FL_EXPANDABLE_SEGMENTS"):
        advice.append(f"set FL_EXPANDABLE_SEGMENTS=1 (expandable_segments:True in "
                      f"{' or '.join(chip.allocator_conf_env)}) against fragmentation")
    if not settings.enable_mixed_precision:
        advice.append("enable_mixed_precision=True (activations in "
                      f"{chip.low_precision_dtype})")
    return f"memory: {figures}. To fit: " + "; ".join(advice) + "."


def add_oom_note(exc: BaseException) -> None:
    """Attach :func:`oom_advice` for the active backend to an out-of-memory error as a note
    (shown with its traceback; the type stays ``torch.OutOfMemoryError``)."""
    selection = active.current()
    if selection is None or not hasattr(exc, "add_note"):
        return
    try:
        note = oom_advice(selection, memory_stats())
    except Exception as failure:  # the note must never hide the error itself
        note = f"flagos_torchfl: no memory figures ({failure})"
    exc.add_note(note)
