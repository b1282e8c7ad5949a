"""Checkpoints: ``torch.load(map_location=...)`` with ``"cuda"``, ``"cuda:N"``, a
``torch.device``, or a dict whose keys and values name CUDA devices; and checkpoints whose storages were
saved on ``cuda`` (their location tags are ``"cuda:N"``) loaded with no ``map_location`` on a
machine without CUDA, or on another chip (``"npu:0"``) whose runtime is not here. All land on
the target device. A callable ``map_location`` is called as
given; when it returns None the storage's own location is translated.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import torch

from ..errors import DeviceOrdinalError
from .devices import Target
from ..patching import Patcher
from .patches import patch_function


def _location(target: Target, location: Any) -> Any:
    """A location tag or map_location value, translated to the target's location string: CUDA
    tags, and tags of another chip this process has no runtime for (``"npu:0"`` written on an
    Ascend machine), both as the logical device of that index."""
    translated = target.translate_named(location)
    if translated is location and location.__class__ is str:
        translated = _foreign(target, location)
    if isinstance(translated, torch.device):
        return str(translated)
    return translated


def _foreign(target: Target, location: str) -> Any:
    """``"TYPE:N"`` of a known chip whose device type torch cannot restore here, as
    ``cuda:N``; anything else unchanged."""
    device_type, _, index = location.partition(":")
    if device_type == target.device_type or device_type not in _chip_device_types():
        return location
    module = getattr(torch, device_type, None)
    if module is not None and getattr(module, "is_available", lambda: False)():
        return location  # that chip's runtime is here: torch restores it itself
    if not index:
        return target.translate("cuda")
    return target.translate(f"cuda:{index}") if index.isdigit() else location


def _chip_device_types() -> frozenset:
    from ..backends.registry import registry

    return frozenset(b.device_type for b in registry().backends()) - {"cpu"}


@patch_function("load_locations", on_cuda=True)
def patch_load_locations(target: Target, patcher: Patcher) -> None:
    """``torch.load``'s storage placement (``torch.serialization._get_restore_location``)."""
    import torch.serialization as serialization

    restore = serialization.default_restore_location
    original = serialization._get_restore_location

    @functools.wraps(original)
    def _get_restore_location(map_location: Any) -> Callable[[Any, str], Any]:
        if map_location is None:
            return lambda storage, location: restore(storage, _location(target, location))
        if isinstance(map_location, dict):
            # keys name devices as the script knows them ("cuda:0"); a checkpoint written on
            # this backend carries the backend's own tags ("npu:0"): both are looked up
            table = {}
            for key, value in map_location.items():
                try:
                    table[_location(target, key)] = value
                except DeviceOrdinalError:
                    pass  # a key naming a device this process lacks matches no storage here
            table.update(map_location)

            def by_table(storage, location):
                return restore(storage, _location(target, table.get(location, location)))

            return by_table
        if isinstance(map_location, (str, bytes, torch.device)):
            where = map_location.decode() if isinstance(map_location, bytes) else map_location
            fixed = _location(target, where)
            return lambda storage, location: restore(storage, fixed)

        def by_function(storage, location):
            result = map_location(storage, location)
            return restore(storage, _location(target, location)) if result is None else result

        return by_function

    patcher.setattr(serialization, "_get_restore_location", _get_restore_location)
