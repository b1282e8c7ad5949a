"""Which chip pool of a cluster can take a job, from ``kubectl get nodes -o json``.

A pool is the nodes labelled ``PREFIX/backend=NAME`` (:mod:`.labels`). A node can take one pod
of the job when it is schedulable and has ``nproc_per_node`` of the chip's device-plugin
resource allocatable (a backend without one needs none). The pool of the highest-priority chip
with enough such nodes is picked, and the answer says why.
"""
from __future__ import annotations

import dataclasses
import json
from typing import List, Mapping, Optional, Sequence, Tuple

from ..backends.base import Backend
from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Pool:
    """One chip's nodes in the file and how many of them can take a pod."""

    backend: Backend
    members: int
    usable: int
    resource: Optional[str]

    def describe(self, nproc_per_node: int, prefix: str) -> str:
        held = f"{nproc_per_node} allocatable {self.resource}" if self.resource else "no device needed"
        return (f"{self.backend.name}: {self.usable} of {self.members} node(s) labelled "
                f"{prefix}/backend={self.backend.name} can take a pod ({held})")


def read_nodes(path: str) -> List[dict]:
    """The nodes of a ``kubectl get nodes -o json`` file (a NodeList, or one Node); ConfigError
    for a file that cannot be read or is not that."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise ConfigError(f"--nodes-json {path!r} cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigError(f"--nodes-json {path!r} is not JSON ({exc}); give the output of "
                          "`kubectl get nodes -o json`") from None
    items = [data] if isinstance(data, dict) and data.get("kind") == "Node" else \
        data.get("items") if isinstance(data, dict) else None
    if not isinstance(items, list) or not all(isinstance(n, dict) for n in items):
        raise ConfigError(f"--nodes-json {path!r} is not a node list; give the output of "
                          "`kubectl get nodes -o json`")
    return items


def _count(quantity) -> int:
    """A device count from an allocatable quantity (a whole number; anything else is 0)."""
    text = str(quantity).strip()
    return int(text) if text.isascii() and text.isdigit() else 0


def _labelled(node: Mapping, prefix: str) -> Optional[str]:
    return ((node.get("metadata") or {}).get("labels") or {}).get(f"{prefix}/backend")


def _allocatable(node: Mapping) -> Mapping:
    return (node.get("status") or {}).get("allocatable") or {}


def pool(nodes: Sequence[Mapping], backend: Backend, nnodes: int, nproc_per_node: int, prefix: str,
         resource: Optional[str] = None) -> Pool:
    """``backend``'s pool: of its resources (``resource`` alone when given), the first with
    ``nnodes`` usable nodes, else the one with the most."""
    members = [n for n in nodes if _labelled(n, prefix) == backend.name
               and not (n.get("spec") or {}).get("unschedulable")]
    candidates = (resource,) if resource else backend.kubernetes.resources
    if not candidates:
        return Pool(backend, len(members), len(members), None)
    best = None
    for name in candidates:
        usable = sum(_count(_allocatable(n).get(name, 0)) >= nproc_per_node for n in members)
        found = Pool(backend, len(members), usable, name)
        if usable >= nnodes:
            return found
        best = found if best is None or usable > best.usable else best
    return best


def choose(nodes: Sequence[Mapping], backends: Sequence[Backend], nnodes: int, nproc_per_node: int,
           prefix: str, source: str, resource: Optional[str] = None) -> Tuple[Pool, str]:
    """The pool to run on, from ``backends`` (highest priority first) and why; ConfigError
    saying what each labelled pool lacks when none will do."""
    pools = [pool(nodes, b, nnodes, nproc_per_node, prefix, resource) for b in backends]
    labelled = [p for p in pools if p.members]
    for found in labelled:
        if found.usable >= nnodes:
            others = [p.describe(nproc_per_node, prefix) for p in labelled if p is not found]
            why = f"{found.describe(nproc_per_node, prefix)}; {nnodes} needed"
            if others:
                why += "; also: " + "; ".join(others)
            return found, why
    wanted = ", ".join(b.name for b in backends)
    lines = [p.describe(nproc_per_node, prefix) for p in labelled] or [
        f"no node is labelled {prefix}/backend={wanted}" + _unlabelled(nodes, backends, prefix)]
    raise ConfigError(f"no chip pool in {source} has {nnodes} node(s) that can take a pod of "
                      f"{nproc_per_node} process(es) for {wanted}: " + "; ".join(lines))


def _unlabelled(nodes: Sequence[Mapping], backends: Sequence[Backend], prefix: str) -> str:
    """A note on nodes that carry a chip's resource but no label (NFD or the labelling
    DaemonSet is missing there)."""
    resources = {r for b in backends for r in b.kubernetes.resources}
    bare = [n for n in nodes if _labelled(n, prefix) is None
            and any(_count(_allocatable(n).get(r, 0)) for r in resources)]
    if not bare:
        return ""
    return (f" ({len(bare)} node(s) have the chip's device resource but no {prefix}/backend label: "
            "run `python -m flagos_torchfl k8s daemonset` with Node Feature Discovery)")
