"""What the cluster would start for each manifest of ``k8s job``: every pod's command and
environment, as its controller injects them and the kubelet expands them.

- Indexed Job (kubernetes batch/v1): pod ``i`` carries the completion-index annotation, which
  ``fieldRef`` env entries read, and ``JOB_COMPLETION_INDEX``; its host name is ``NAME-i`` and,
  with ``subdomain`` set to a headless Service that selects it, ``NAME-i.SUBDOMAIN`` resolves.
- TrainJob, torch-distributed runtime (kubeflow/trainer pkg/runtime/framework/plugins/torch):
  ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the completion index of the JobSet's
  ``node`` job), ``PET_MASTER_ADDR=NAME-node-0-0.NAME``, ``PET_MASTER_PORT=29400``.
- PyTorchJob (kubeflow/training-operator pkg/controller.v1/pytorch/envvar.go, master.go):
  ``PYTHONUNBUFFERED=0``, ``MASTER_PORT`` (the ``pytorchjob-port``), ``MASTER_ADDR=NAME-master-0``,
  ``WORLD_SIZE`` (replicas x nprocPerNode), ``RANK`` (Master 0, Worker i -> i+1),
  ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_NNODES``.
- kubelet: ``$(VAR)`` in command and args is replaced by the container's variable ``VAR`` when
  defined, ``$$`` gives ``$``, anything else is kept.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Dict, List

TRAINER_PORT = 29400


@dataclasses.dataclass
class Pod:
    """One pod: its DNS name, its container's command and args as written, and its environment."""

    host: str
    args: List[str]
    env: Dict[str, str]

    def start(self, overrides: Dict[str, str]):
        """The argv and environment the kubelet starts, with ``overrides`` put into the
        environment before the expansion of ``$(VAR)``."""
        env = {**self.env, **overrides}
        return [expand(a, env) for a in self.args], env


def expand(text: str, env: Dict[str, str]) -> str:
    """Kubernetes' expansion of one command or args entry."""
    def repl(match):
        token = match.group(0)
        if token == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else token

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", repl, text)


def _env(entries, annotations: Dict[str, str]) -> Dict[str, str]:
    env = {}
    for entry in entries or []:
        if "value" in entry:
            env[entry["name"]] = expand(entry["value"], env)
        else:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            key = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path).group(1)
            env[entry["name"]] = annotations[key]
    return env


def _pod(host: str, container: dict, env: Dict[str, str]) -> Pod:
    return Pod(host, container.get("command", []) + container.get("args", []), env)


def job_pods(service: dict, job: dict) -> List[Pod]:
    """The pods of an Indexed Job, and the check that the Service gives them their DNS names."""
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] == spec["completions"]
    template = job["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None", "the Service must be headless"
    assert service["spec"]["selector"].items() <= labels.items(), "the Service does not select the pods"
    assert template["spec"]["subdomain"] == service["metadata"]["name"]
    pods = []
    for index in range(spec["completions"]):
        annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
        container = template["spec"]["containers"][0]
        env = _env(container["env"], annotations)
        env["JOB_COMPLETION_INDEX"] = str(index)
        host = f"{job['metadata']['name']}-{index}.{template['spec']['subdomain']}"
        pods.append(_pod(host, container, env))
    return pods


def trainjob_pods(train_job: dict) -> List[Pod]:
    name = train_job["metadata"]["name"]
    trainer = train_job["spec"]["trainer"]
    pods = []
    for index in range(trainer["numNodes"]):
        env = _env(trainer.get("env"), {})
        env.update(PET_NNODES=str(trainer["numNodes"]), PET_NPROC_PER_NODE=str(trainer["numProcPerNode"]),
                   PET_NODE_RANK=str(index), PET_MASTER_ADDR=f"{name}-node-0-0.{name}",
                   PET_MASTER_PORT=str(TRAINER_PORT))
        pods.append(_pod(f"{name}-node-0-{index}.{name}", trainer, env))
    return pods


def pytorchjob_pods(pytorch_job: dict) -> List[Pod]:
    name = pytorch_job["metadata"]["name"]
    specs = pytorch_job["spec"]["pytorchReplicaSpecs"]
    nproc = pytorch_job["spec"]["nprocPerNode"]
    total = sum(s["replicas"] for s in specs.values())
    master = specs["Master"]["template"]["spec"]["containers"][0]
    port = next(p["containerPort"] for p in master["ports"] if p["name"] == "pytorchjob-port")
    pods = []
    for rtype, spec in specs.items():
        for index in range(spec["replicas"]):
            rank = index + (1 if rtype == "Worker" else 0)
            container = spec["template"]["spec"]["containers"][0]
            assert container["name"] == "pytorch", "the operator configures the container named pytorch"
            env = _env(container.get("env"), {})
            env.update(PYTHONUNBUFFERED="0", MASTER_PORT=str(port), MASTER_ADDR=f"{name}-master-0",
                       WORLD_SIZE=str(total * int(nproc)), RANK=str(rank), PET_NPROC_PER_NODE=nproc,
                       PET_NODE_RANK=str(rank), PET_NNODES=str(total))
            pods.append(_pod(f"{name}-{rtype.lower()}-{index}", container, env))
    return pods


def pods(manifests: List[dict]) -> List[Pod]:
    """Every pod the manifests of one ``k8s job`` start."""
    kinds = [m["kind"] for m in manifests]
    if kinds == ["Service", "Job"]:
        return job_pods(*manifests)
    if kinds == ["TrainJob"]:
        return trainjob_pods(manifests[0])
    if kinds == ["PyTorchJob"]:
        return pytorchjob_pods(manifests[0])
    raise AssertionError(f"unexpected manifests {kinds}")
