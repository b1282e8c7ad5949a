"""The pods of each ``k8s job`` kind, replayed on this machine: every replica's command and
environment as its controller injects them (tests/e2e/k8s_controllers.py), 2 pods x 1 process, each
pod a local process tree. The cluster's DNS is this host: the master's host name resolves to
127.0.0.1 only when the manifests wire it up, and the fixed rendezvous port is replaced by a
free one (this machine is shared). The image's ``python`` is this interpreter."""
from __future__ import annotations

import contextlib
import io
import json
import sys
import threading

import pytest
import yaml

from flagos_torchfl.cli import main
from tests.helpers import clean_env, free_port, run_tree
from tests.e2e.k8s_controllers import pods

SCRIPT = "tests/e2e/clients/tiny_ddp.py"
#: an argument Kubernetes' $(VAR) expansion would change if the manifest did not escape it (not
#: with "$$": torchrun's own ${local_rank} macro turns "$$" into "$" in the script's arguments)
LITERAL = "$(MASTER_PORT)-$NODE_RANK"
PORT_VARIABLES = ("MASTER_PORT", "PET_MASTER_PORT")


def manifests(kind: str, backend: str, out) -> list:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        code = main(["k8s", "job", "--backend", backend, "--nodes", "2", "--nproc-per-node", "1",
                     "--image", "registry.example.com/train:1", "--kind", kind, "--", SCRIPT, str(out), LITERAL])
    assert code == 0
    return list(yaml.safe_load_all(stdout.getvalue()))


def local(pod, hosts, port):
    """The pod's argv and environment on this machine: the cluster's names resolve to this host."""
    overrides = {k: "127.0.0.1" for k, v in pod.env.items() if v in hosts}
    overrides.update({name: str(port) for name in PORT_VARIABLES if name in pod.env})
    argv, env = pod.start(overrides)
    return [sys.executable if a == "python" else a for a in argv], env


@pytest.mark.parametrize("backend", ["cpu", "sim"])
@pytest.mark.parametrize("kind", ["job", "trainjob", "pytorchjob"])
def test_pods_train_as_the_controller_starts_them(kind, backend, tmp_path):
    replicas = pods(manifests(kind, backend, tmp_path))
    assert len(replicas) == 2
    hosts = {p.host for p in replicas} | {p.host.split(".")[0] for p in replicas}
    master = replicas[0].env.get("MASTER_ADDR") or replicas[0].env.get("PET_MASTER_ADDR")
    assert master in hosts, f"the master address {master!r} is no pod's DNS name ({sorted(hosts)})"
    port = free_port()
    results = [None, None]

    def start(i, pod):
        argv, env = local(pod, hosts, port)
        results[i] = run_tree(argv, env={**clean_env(), **env}, timeout=150, merge_stderr=True)

    threads = [threading.Thread(target=start, args=(i, p)) for i, p in enumerate(replicas)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for pod, proc in zip(replicas, results):
        assert proc.returncode == 0, f"{pod.host}:\n{proc.stdout[-4000:]}"
    records = [json.loads((tmp_path / f"tiny_ddp.rank{r}.json").read_text()) for r in (0, 1)]
    expected_device = {"cpu": ("cpu", "gloo"), "sim": ("sim", "simccl")}[backend]
    for rank, record in enumerate(records):
        assert record["world_size"] == 2 and record["group_rank"] == rank
        assert (record["device"], record["collective"]) == expected_device
        assert record["argv"] == [LITERAL]
        assert record["losses"][-1] < record["losses"][0]
    assert records[0]["weights"] == records[1]["weights"], "DDP kept the ranks' weights apart"
    assert records[0]["losses"] != records[1]["losses"]  # each rank had its own batch
