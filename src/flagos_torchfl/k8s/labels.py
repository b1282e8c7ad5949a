"""This node's labels in Node Feature Discovery's local-source format.

NFD reads every regular, non-hidden file in :data:`FEATURES_DIR` at each pass, one
``KEY[=VALUE]`` per line (surrounding space trimmed, ``#`` lines are comments), and publishes
each key as a node label (``source/local/local.go`` in kubernetes-sigs/node-feature-discovery).
A key ``prefix/name`` is published as it is; the prefix must be a namespace NFD allows (any but
``kubernetes.io`` and ``k8s.io`` ones by default). Values are made valid Kubernetes label values
(:func:`label_value`). Numbers are plain integers so node affinity can compare them (``Gt``).
"""
from __future__ import annotations

import os
import re
from typing import Dict, Mapping

from .. import atomic_file
from ..errors import ConfigError

#: the label prefix (a DNS subdomain) every key is published under
PREFIX = "torchfl.flagos.io"
#: the folder NFD's local source reads, on the node
FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
#: the file this package writes there
FILE_NAME = "flagos-torchfl"
MAX_VALUE = 63
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9._-]+")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")


def label_value(text: object) -> str:
    """``text`` as a valid Kubernetes label value: each run of characters other than letters,
    digits, ``.``, ``_`` and ``-`` becomes one ``-``, then at most 63 characters, beginning and
    ending with a letter or digit (so possibly empty)."""
    value = _NOT_ALLOWED.sub("-", str(text))[:MAX_VALUE]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)


def check_prefix(prefix: str) -> str:
    """``prefix`` when it is a valid label prefix (a lowercase DNS subdomain of at most 253
    characters) in a namespace NFD publishes labels in; else ConfigError."""
    if len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix):
        raise ConfigError(f"label prefix {prefix!r} is not valid: give a lowercase DNS subdomain "
                          f"such as {PREFIX!r}")
    reserved = re.search(r"(^|\.)(kubernetes\.io|k8s\.io)$", prefix)
    if reserved and not re.search(r"(^|\.)(feature|profile)\.node\.kubernetes\.io$", prefix):
        raise ConfigError(f"label prefix {prefix!r} is in a namespace NFD does not publish labels in "
                          "(kubernetes.io and k8s.io ones other than feature.node.kubernetes.io and "
                          f"profile.node.kubernetes.io); use your own, such as {PREFIX!r}")
    return prefix


def node_labels(row: Mapping, torch_version: str, package_version: str) -> Dict[str, str]:
    """Label name -> value for the backend ``row`` (one row of ``detect --json``'s
    ``backends``: the backend automatic selection picks here). Values that are unknown are left
    out."""
    devices = row.get("devices") or []
    memory = [d["total_memory"] for d in devices if d.get("total_memory")]
    labels = {
        "backend": row["name"],
        "device-count": str(len(devices)),
        "device-model": devices[0]["name"] if devices else None,
        "device-memory-mib": str(min(memory) >> 20) if memory else None,
        "low-precision-dtype": row.get("low_precision_dtype"),
        "plugin": row.get("plugin"),
        ("plugin-version" if row.get("plugin") else "runtime-version"): row.get("runtime"),
        "driver-version": row.get("driver"),
        "torch-version": torch_version,
        "torchfl-version": package_version,
    }
    cleaned = {key: label_value(value) for key, value in labels.items() if value is not None}
    return {key: value for key, value in cleaned.items() if value}


def render(labels: Mapping[str, str], prefix: str = PREFIX) -> str:
    """The feature file: a comment line, then ``prefix/name=value`` lines."""
    check_prefix(prefix)
    lines = ["# node labels written by `python -m flagos_torchfl k8s labels` for NFD's local source"]
    lines += [f"{prefix}/{key}={value}" for key, value in labels.items()]
    return "\n".join(lines) + "\n"


def write(text: str, directory: str, name: str = FILE_NAME) -> str:
    """Write ``text`` (ASCII) to ``directory/name`` atomically, mode 0o644 (a hidden temporary
    ``.<name>.<8 hex>.tmp`` in the same folder, which NFD skips, renamed over it:
    :func:`~flagos_torchfl.atomic_file.replaced`); returns the path. OSError when it cannot."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with atomic_file.replaced(path) as out:
        os.fchmod(out.fileno(), 0o644)
        out.write(text.encode("ascii"))
    return path
