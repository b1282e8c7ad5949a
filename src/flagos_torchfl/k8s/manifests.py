"""The manifests of ``k8s job`` and ``k8s daemonset``, as plain dicts (:mod:`.emit` writes them).

Every pod of a job selects its nodes by the label ``PREFIX/backend`` (:mod:`.labels`), requests
``nproc_per_node`` of the chip's device-plugin resource, sets ``FL_BACKEND``, mounts a
memory-backed ``/dev/shm`` and runs ``python -m flagos_torchfl run -- torchrun ... SCRIPT ARGS``.
The rendezvous is the one each kind provides:

- ``job``: an Indexed Job and a headless Service of the same name. Pod ``i`` is
  ``NAME-i.NAME`` in DNS (the Job's ``subdomain``); its completion index is its node rank, and
  pod 0 is the master.
- ``trainjob``: Kubeflow Trainer's ``TrainJob`` on the ``torch-distributed`` runtime, which
  sets ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR`` and
  ``PET_MASTER_PORT``; torchrun reads them. ``numProcPerNode`` is set: Trainer's ``auto``
  counts only resources whose name contains "gpu" (other chips would get the CPU count).
- ``pytorchjob``: the training operator's ``PyTorchJob`` (Master + Workers), which sets
  ``MASTER_ADDR``, ``MASTER_PORT``, ``PET_NNODES``, ``PET_NPROC_PER_NODE`` and ``PET_NODE_RANK``;
  torchrun is given the master's address and port from them.

Arguments of the program are passed through Kubernetes' ``$(VAR)`` expansion unchanged (each
``$`` written as ``$$``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List, Optional, Tuple

from ..backends.base import Backend
from ..errors import ConfigError, suggestion
from . import labels

KINDS = ("job", "trainjob", "pytorchjob")
#: torchrun's rendezvous port in the Indexed Job (Trainer uses 29400, the operator 23456)
JOB_PORT = 29500
PYTORCHJOB_PORT = 23456
#: Trainer's runtime for torchrun, and the names of its replicated job and container
TRAINER_RUNTIME = "torch-distributed"
TRAINER_NODE = "node"
SHM = {"name": "dshm", "emptyDir": {"medium": "Memory"}}
SHM_MOUNT = {"name": "dshm", "mountPath": "/dev/shm"}
LAUNCH = ("python", "-m", "flagos_torchfl", "run", "--", "torchrun")
#: the pod annotation that carries an Indexed Job's completion index
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
MAX_PROCESSES = 128
_NAME = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_IMAGE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*")
_RESOURCE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+"
                       r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """One job, checked (build it with :func:`job_request`)."""

    kind: str
    backend: Backend
    nodes: int
    nproc_per_node: int
    image: str
    program: Tuple[str, ...]
    name: str
    namespace: Optional[str]
    resource: Optional[str]
    prefix: str


def job_request(kind: str, backend: Backend, nodes: int, nproc_per_node: int, image: str,
                program, name: Optional[str] = None, namespace: Optional[str] = None,
                resource: Optional[str] = None, prefix: str = labels.PREFIX) -> JobRequest:
    """A checked :class:`JobRequest`; ConfigError naming the bad value and what is valid.
    ``resource`` None: the backend's usual device-plugin resource (none for a backend without
    one)."""
    if kind not in KINDS:
        raise ConfigError(f"unknown kind {kind!r}.{suggestion(kind, KINDS)} Valid: {', '.join(KINDS)}")
    if not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"--nodes {nodes} is not valid: give a number of nodes, 1 or more")
    if not isinstance(nproc_per_node, int) or not 1 <= nproc_per_node <= MAX_PROCESSES:
        raise ConfigError(f"--nproc-per-node {nproc_per_node} is not valid: give a number of processes "
                          f"per node from 1 to {MAX_PROCESSES}")
    check_image(image)
    program = tuple(program)
    if not program:
        raise ConfigError("no program given: end the command with `-- SCRIPT ARGS...`")
    name = name if name is not None else f"torchfl-{backend.name}"
    check_name(name, kind, nodes)
    if namespace is not None and (len(namespace) > 63 or not _NAMESPACE.fullmatch(namespace)):
        raise ConfigError(f"namespace {namespace!r} is not valid: lowercase letters, digits and '-', "
                          "at most 63, beginning and ending with a letter or digit")
    if resource is None:
        resource = backend.kubernetes.resources[0] if backend.kubernetes.resources else None
    else:
        check_resource(resource)
    return JobRequest(kind, backend, nodes, nproc_per_node, image, program, name, namespace,
                      resource, labels.check_prefix(prefix))


def check_image(image: str) -> str:
    """``image`` when it reads as a container image reference; else ConfigError."""
    if not _IMAGE.fullmatch(image or ""):
        if not image:
            problem = "it is empty"
        elif re.search(r"\s", image):
            problem = "it holds white space"
        else:
            problem = "it holds characters an image reference cannot"
        raise ConfigError(f"image {image!r} is not valid: {problem}; give a reference such as "
                          "registry.example.com/team/train:1.0")
    return image


def check_name(name: str, kind: str, nodes: int) -> str:
    """``name`` when it is a DNS label its kind's pod host names can be made of (at most 63
    characters with the controller's suffix); else ConfigError."""
    suffix = _host_suffix(kind, nodes)
    longest = 63 - len(suffix)
    if len(name) > longest or not _NAME.fullmatch(name):
        raise ConfigError(f"--name {name!r} is not valid: lowercase letters, digits and '-', beginning "
                          f"with a letter, at most {longest} characters (pod host names add "
                          f"{suffix!r})")
    return name


def _host_suffix(kind: str, nodes: int) -> str:
    """What the controller appends to the job's name for its last pod's host name."""
    if kind == "job":
        return f"-{nodes - 1}"
    if kind == "trainjob":
        return f"-{TRAINER_NODE}-0-{nodes - 1}"
    return f"-worker-{max(nodes - 2, 0)}"


def check_resource(resource: str) -> str:
    """``resource`` when it is an extended-resource name (``domain/name``, outside
    ``kubernetes.io``); else ConfigError."""
    if len(resource) > 316 or not _RESOURCE.fullmatch(resource) \
            or re.search(r"(^|\.)kubernetes\.io/", resource):
        raise ConfigError(f"--resource {resource!r} is not valid: give a device-plugin resource "
                          "name `domain/name`, such as nvidia.com/gpu or huawei.com/Ascend910")
    return resource


def escape(argument: str) -> str:
    """``argument`` as Kubernetes' ``$(VAR)`` expansion of command and args gives it back."""
    return argument.replace("$", "$$")


def build(request: JobRequest) -> List[dict]:
    """The manifests of ``request``, in the order they are applied."""
    return {"job": indexed_job, "trainjob": train_job, "pytorchjob": pytorch_job}[request.kind](request)


def _metadata(request: JobRequest, name: str) -> dict:
    meta = {"name": name}
    if request.namespace:
        meta["namespace"] = request.namespace
    meta["labels"] = {f"{request.prefix}/backend": request.backend.name}
    return meta


def _resources(request: JobRequest) -> Dict[str, dict]:
    if not request.resource:
        return {}
    amount = {request.resource: str(request.nproc_per_node)}
    return {"limits": dict(amount), "requests": dict(amount)}


def _node_selector(request: JobRequest) -> Dict[str, str]:
    """Nodes labelled with the chip; none for a backend no node is labelled with (the sim runs on
    any node)."""
    if not request.backend.auto_selectable:
        return {}
    return {f"{request.prefix}/backend": request.backend.name}


def _env(request: JobRequest, extra: Tuple[dict, ...] = ()) -> List[dict]:
    return [{"name": "FL_BACKEND", "value": request.backend.name}, *extra]


def _program(request: JobRequest) -> List[str]:
    return [escape(a) for a in request.program]


def _container(request: JobRequest, name: str, command: List[str], env: List[dict],
               ports: List[dict]) -> dict:
    container = {"name": name, "image": request.image, "command": command, "env": env}
    resources = _resources(request)
    if resources:
        container["resources"] = resources
    container["ports"] = ports
    container["volumeMounts"] = [dict(SHM_MOUNT)]
    return container


def _pod_spec(request: JobRequest, container: dict, **fields) -> dict:
    spec = dict(fields)
    selector = _node_selector(request)
    if selector:
        spec["nodeSelector"] = selector
    spec["containers"] = [container]
    spec["volumes"] = [dict(SHM, emptyDir=dict(SHM["emptyDir"]))]
    return spec


def indexed_job(request: JobRequest) -> List[dict]:
    """A headless Service and an Indexed Job, both named ``request.name``."""
    name = request.name
    pod_label = {f"{request.prefix}/job": name}
    service = {
        "apiVersion": "v1", "kind": "Service", "metadata": _metadata(request, name),
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": dict(pod_label),
                 "ports": [{"name": "rendezvous", "port": JOB_PORT, "targetPort": JOB_PORT}]},
    }
    command = [*LAUNCH, f"--nnodes={request.nodes}", f"--nproc-per-node={request.nproc_per_node}",
               "--node-rank=$(NODE_RANK)", "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)",
               *_program(request)]
    env = _env(request, (
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": "MASTER_ADDR", "value": f"{name}-0.{name}"},
        {"name": "MASTER_PORT", "value": str(JOB_PORT)},
    ))
    container = _container(request, "trainer", command, env,
                           [{"name": "rendezvous", "containerPort": JOB_PORT}])
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(request, name),
        "spec": {
            "completionMode": "Indexed", "completions": request.nodes, "parallelism": request.nodes,
            # a lost rank cannot rejoin torchrun's static rendezvous: fail the whole job
            "backoffLimit": 0,
            "template": {"metadata": {"labels": dict(pod_label)},
                         "spec": _pod_spec(request, container, subdomain=name, restartPolicy="Never")},
        },
    }
    return [service, job]


def train_job(request: JobRequest) -> List[dict]:
    """A Kubeflow Trainer TrainJob (``trainer.kubeflow.org/v1alpha1``) on ``torch-distributed``;
    node selection and ``/dev/shm`` go in a runtime patch of the runtime's ``node`` job."""
    trainer = {"image": request.image, "command": [*LAUNCH, *_program(request)],
               "numNodes": request.nodes, "numProcPerNode": request.nproc_per_node, "env": _env(request)}
    resources = _resources(request)
    if resources:
        trainer["resourcesPerNode"] = resources
    pod = {"containers": [{"name": TRAINER_NODE, "volumeMounts": [dict(SHM_MOUNT)]}],
           "volumes": [dict(SHM, emptyDir=dict(SHM["emptyDir"]))]}
    selector = _node_selector(request)
    if selector:
        pod = {"nodeSelector": selector, **pod}
    patch = {"manager": "flagos-torchfl", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": TRAINER_NODE, "template": {"spec": {"template": {"spec": pod}}}}]}}}}
    return [{
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": _metadata(request, request.name),
        "spec": {"runtimeRef": {"name": TRAINER_RUNTIME}, "trainer": trainer, "runtimePatches": [patch]},
    }]


def pytorch_job(request: JobRequest) -> List[dict]:
    """A training-operator PyTorchJob (``kubeflow.org/v1``): a Master and ``nodes - 1`` Workers."""
    command = [*LAUNCH, "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)", *_program(request)]

    def replica(count: int) -> dict:
        container = _container(request, "pytorch", command, _env(request),
                               [{"name": "pytorchjob-port", "containerPort": PYTORCHJOB_PORT}])
        return {"replicas": count, "restartPolicy": "Never",
                "template": {"spec": _pod_spec(request, container)}}

    specs = {"Master": replica(1)}
    if request.nodes > 1:
        specs["Worker"] = replica(request.nodes - 1)
    return [{
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(request, request.name),
        "spec": {"nprocPerNode": str(request.nproc_per_node), "pytorchReplicaSpecs": specs,
                 "runPolicy": {"backoffLimit": 0}},
    }]


def daemonset(image: str, backends, namespace: Optional[str] = None, prefix: str = labels.PREFIX,
              interval: int = 600, name: str = "flagos-torchfl-labels") -> dict:
    """A DaemonSet that runs ``k8s labels --write`` on every node (tolerating every taint), every
    ``interval`` seconds, into the host folder NFD's local source reads. It runs privileged (it
    sees the node's devices without requesting any) with each backend's ``kubernetes.probe_env``."""
    check_image(image)
    labels.check_prefix(prefix)
    if interval < 1:
        raise ConfigError(f"--interval {interval} is not valid: give seconds, 1 or more")
    env: Dict[str, str] = {}
    for backend in backends:
        env.update(backend.kubernetes.probe_env)
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    selector = {"app.kubernetes.io/name": name}
    command = ["python", "-m", "flagos_torchfl", "k8s", "labels", "--write", labels.FEATURES_DIR,
               "--prefix", prefix, "--interval", str(interval)]
    container = {"name": "labels", "image": image, "command": command,
                 "env": [{"name": k, "value": v} for k, v in sorted(env.items())],
                 "securityContext": {"privileged": True},
                 "volumeMounts": [{"name": "features-d", "mountPath": labels.FEATURES_DIR}]}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta,
        "spec": {"selector": {"matchLabels": dict(selector)}, "template": {
            "metadata": {"labels": dict(selector)},
            "spec": {"tolerations": [{"operator": "Exists"}], "containers": [container],
                     "volumes": [{"name": "features-d", "hostPath": {"path": labels.FEATURES_DIR,
                                                                     "type": "DirectoryOrCreate"}}]}}},
    }

