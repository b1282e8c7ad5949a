"""Chip families: one module per family, a shared base, and a registry."""
from .base import Backend, DeviceInfo, KubernetesDevices, ProbeResult, Unavailable
from .registry import ENTRY_POINT_GROUP, Registry, get_backend, register_backend, registry

__all__ = [
    "Backend", "DeviceInfo", "KubernetesDevices", "ProbeResult", "Unavailable", "ENTRY_POINT_GROUP", "Registry",
    "get_backend", "register_backend", "registry",
]
