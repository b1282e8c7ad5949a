"""The activation a process hands to its Python children.

Every activation, the launcher's and every one a program makes with ``ft.init_backend(...)``
or a setting assignment, publishes itself in the internal variable ``FL_PARENT_ACTIVATION``:
the backend, the devices (physical indices), every setting, the probe result, and the
device-related environment it was made in. Deactivation restores the previous value. Python
children read it as they activate (``bootstrap/sitecustomize.py``, which ``run`` hands to its
program and activation in code to the children started after it:
:func:`hand_down`). A child activates from it:

- with the environment unchanged, exactly the same way, probing nothing (not even a vendor
  tool); only the vendor plugin is imported;
- with a changed device environment (its own ``CUDA_VISIBLE_DEVICES``, ``LOCAL_WORLD_SIZE``,
  ``FL_*`` values...), the same backend and settings but its own probe and its own devices
  (``gpu_ids`` are not carried over: they index the parent's devices); its ``FL_*`` variables
  win as always.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, MutableMapping, Optional

from . import variables
from .backends import DeviceInfo, ProbeResult, registry
from .errors import ConfigError

RECORD = "FL_PARENT_ACTIVATION"
#: folder holding the ``sitecustomize.py`` that activates child interpreters
BOOTSTRAP_DIR = str(Path(__file__).resolve().parent / "bootstrap")
#: device variables besides the ``FL_*`` ones and each backend's visible-devices variable
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE")


def hook_children(environ: MutableMapping[str, str]) -> None:
    """Put :data:`BOOTSTRAP_DIR` first on ``environ``'s ``PYTHONPATH`` and set ``FL_ACTIVATE=1``:
    every Python child started with ``environ`` activates after it imports torch."""
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *paths])
    variables.assign(environ, "FL_ACTIVATE", "1")


def hand_down(selection, environ: MutableMapping[str, str] = os.environ) -> Callable[[], None]:
    """Make the Python children this process starts from now on activate as ``selection``, as
    ``run`` makes its program's: the selection published (:func:`publish`) and the start-up
    hook handed down (:func:`hook_children`). What activation in code (``ft.init_backend``)
    does for ``multiprocessing`` spawn and forkserver workers, ``torch.multiprocessing.spawn``
    and ``subprocess`` children. Returns the undo that gives the variables back the values they
    had."""
    undo = variables.restorer(environ, ("PYTHONPATH", "FL_ACTIVATE", RECORD))
    hook_children(environ)
    publish(selection, environ)
    return undo


def fingerprint(environ: Mapping[str, str] = os.environ) -> Dict[str, Optional[str]]:
    """The environment a selection depends on: every user ``FL_*`` variable and device mask."""
    names = {v.name for v in variables.VARIABLES.values() if not v.internal}
    names.update(DEVICE_VARIABLES)
    names.update(b.visible_devices_env for b in registry().backends() if b.visible_devices_env)
    return {name: environ.get(name) for name in sorted(names)}


def _settings(selection) -> Dict[str, Any]:
    s = selection.settings
    limit = s.memory_virtual_limit
    return {
        "gpu_ids": list(selection.devices),
        "memory_virtual_limit": None if limit is None else (limit.bytes if limit.bytes is not None else limit.fraction),
        "memory_pool_clear_interval": s.memory_pool_clear_interval,
        "enable_mixed_precision": s.enable_mixed_precision,
    }


def publish(selection, environ: MutableMapping[str, str] = os.environ) -> None:
    """Write ``selection`` to ``FL_PARENT_ACTIVATION`` (:func:`hand_down` arranges its undo)."""
    probe = selection.probe.as_dict() if selection.probe is not None else None
    environ[RECORD] = json.dumps({
        "backend": selection.backend, "reason": selection.reason, "settings": _settings(selection),
        "probe": probe, "environment": fingerprint(environ),
    }, separators=(",", ":"))


def read_record(environ: Mapping[str, str] = os.environ) -> Optional[dict]:
    """The published parent activation, or None; ConfigError when it cannot be read."""
    text = variables.read(RECORD, environ)
    if text is None:
        return None
    try:
        record = json.loads(text)
        record["backend"], record["settings"]  # noqa: B018 - required keys
    except (ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{RECORD} is not an activation this package wrote ({exc}); unset it") from None
    return record


def _probe_result(data: dict) -> ProbeResult:
    fields = dict(data)
    fields["devices"] = [DeviceInfo(**d) for d in fields.get("devices", [])]
    return ProbeResult(**fields)


def inherited_selection(environ: Mapping[str, str] = os.environ):
    """The Selection this process inherits from its parent's published activation (None when
    there is none). Bad input raises before anything is activated."""
    from .routing.config import routing_config
    from .selection import assemble, build_selection, merge_settings

    record = read_record(environ)
    if record is None:
        return None
    code = {k: v for k, v in record["settings"].items() if v is not None}
    if record.get("environment") == fingerprint(environ) and record.get("probe"):
        variables.validate(environ)
        merged = merge_settings(code, environ)
        why = f"inherited from the parent process ({record.get('reason', '')})"
        return assemble(record["backend"], "inherited", why, _probe_result(record["probe"]), merged,
                        routing_config(environ), environ)
    code.pop("gpu_ids", None)
    return build_selection(record["backend"], code, environ)

