"""The chips: one module per chip family behind a shared base (``base.Backend``), the sim's profiles
(``profile``) and the registry. What they need of the machine is in ``machine/``, the vendors' tables
in ``tables/``."""
from .base import Backend, DeviceInfo, KubernetesDevices, ProbeResult, Unavailable
from .registry import ENTRY_POINT_GROUP, Registry, get_backend, register_backend, registry

__all__ = [
    "Backend", "DeviceInfo", "KubernetesDevices", "ProbeResult", "Unavailable", "ENTRY_POINT_GROUP", "Registry",
    "get_backend", "register_backend", "registry",
]
