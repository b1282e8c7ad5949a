"""``k8s job`` and ``k8s daemonset``: every chip's manifests are valid for Kubernetes 1.33
(kubernetes-validate's strict schemas, offline) and for the Kubeflow SDKs' models (a manifest is
read into the SDK's model and written back: any field the model does not know is lost, any value
of the wrong type is refused); bad input is a clear error that prints no manifest."""
from __future__ import annotations

import contextlib
import copy
import io
import json
import sys

import kubernetes_validate
import pytest
import yaml
from kubeflow.training.api_client import ApiClient
from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

from flagos_torchfl.cli import main
from flagos_torchfl.k8s import emit
from tests.helpers import run_python

K8S = "1.33.0"
PREFIX = "torchfl.flagos.io"
#: the device plugins' resource names (NVIDIA, AMD, Huawei Ascend, Cambricon, Moore Threads, Intel)
VENDOR_RESOURCES = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu", "ascend": "huawei.com/Ascend910",
                    "cambricon": "cambricon.com/mlu", "mthreads": "mthreads.com/gpu", "xpu": "gpu.intel.com/i915"}
CHIPS = sorted(VENDOR_RESOURCES)
LAUNCH = ["python", "-m", "flagos_torchfl", "run", "--", "torchrun"]


def cli(*argv):
    """(exit code, stdout, stderr) of the command line, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse's own usage errors
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def job(backend, *extra, kind="job", nodes=2, nproc=8):
    code, out, err = cli("k8s", "job", "--backend", backend, "--nodes", str(nodes), "--nproc-per-node", str(nproc),
                         "--image", "registry.example.com/team/train:1.0", "--kind", kind, *extra,
                         "--", "train.py", "--epochs", "1")
    assert code == 0, err
    return list(yaml.safe_load_all(out))


def validate(manifest):
    assert kubernetes_validate.validate(manifest, K8S, strict=True) == "1.33"


def as_pod_template(template):
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "check"}, "template": template}


def pytorchjob_model_round_trip(manifest):
    client = ApiClient()
    model = client._ApiClient__deserialize(copy.deepcopy(manifest), "KubeflowOrgV1PyTorchJob")
    return client.sanitize_for_serialization(model)


def trainjob_model_round_trip(manifest):
    return TrainerV1alpha1TrainJob.from_dict(copy.deepcopy(manifest)).to_dict()


def pod_checks(backend, spec, container, nproc=8):
    """What every pod of every kind must hold."""
    resource = VENDOR_RESOURCES.get(backend)
    if resource:
        assert container["resources"] == {"limits": {resource: str(nproc)}, "requests": {resource: str(nproc)}}
    assert spec["nodeSelector"] == {f"{PREFIX}/backend": backend}
    assert {"name": "FL_BACKEND", "value": backend} in container["env"]
    shm = next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    assert {"name": shm, "emptyDir": {"medium": "Memory"}} in spec["volumes"]
    assert container["command"][:6] == LAUNCH and container["command"][-3:] == ["train.py", "--epochs", "1"]


@pytest.mark.parametrize("backend", CHIPS)
def test_indexed_job_and_headless_service_are_valid_for_kubernetes_1_33(backend):
    service, batch = job(backend)
    validate(service)
    validate(batch)
    name = f"torchfl-{backend}"
    assert (service["kind"], batch["kind"]) == ("Service", "Job")
    assert service["metadata"]["name"] == batch["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None"
    spec = batch["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    pod = spec["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == name
    container = pod["spec"]["containers"][0]
    pod_checks(backend, pod["spec"], container)
    env = {e["name"]: e for e in container["env"]}
    assert env["MASTER_ADDR"]["value"] == f"{name}-0.{name}"
    assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert container["command"][6:11] == ["--nnodes=2", "--nproc-per-node=8", "--node-rank=$(NODE_RANK)",
                                          "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)"]


@pytest.mark.parametrize("backend", CHIPS)
def test_trainjob_sets_the_process_count_and_fits_the_trainer_sdk_model(backend):
    (train,) = job(backend, kind="trainjob")
    assert trainjob_model_round_trip(train) == train
    assert (train["apiVersion"], train["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert train["spec"]["runtimeRef"] == {"name": "torch-distributed"}
    trainer = train["spec"]["trainer"]
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 8  # an int, never "auto"
    resource = VENDOR_RESOURCES[backend]
    assert trainer["resourcesPerNode"] == {"limits": {resource: "8"}, "requests": {resource: "8"}}
    assert trainer["command"] == [*LAUNCH, "train.py", "--epochs", "1"]  # torchrun reads Trainer's PET_*
    assert {"name": "FL_BACKEND", "value": backend} in trainer["env"]
    (patch,) = train["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    assert node["name"] == "node" and pod["containers"][0]["name"] == "node"
    assert pod["nodeSelector"] == {f"{PREFIX}/backend": backend}
    assert pod["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]


@pytest.mark.parametrize("backend", CHIPS)
def test_pytorchjob_sets_the_process_count_and_fits_the_training_sdk_model(backend):
    (pj,) = job(backend, kind="pytorchjob", nodes=3)
    assert pytorchjob_model_round_trip(pj) == pj
    assert (pj["apiVersion"], pj["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    assert pj["spec"]["nprocPerNode"] == "8"
    specs = pj["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Master": 1, "Worker": 2}
    for replica in specs.values():
        validate(as_pod_template(replica["template"]))
        container = replica["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch"
        assert {"name": "pytorchjob-port", "containerPort": 23456} in container["ports"]
        pod_checks(backend, replica["template"]["spec"], container)
        assert "--master-addr=$(MASTER_ADDR)" in container["command"]


def test_a_single_node_pytorchjob_has_only_a_master():
    (pj,) = job("cuda", kind="pytorchjob", nodes=1)
    assert list(pj["spec"]["pytorchReplicaSpecs"]) == ["Master"]
    assert pytorchjob_model_round_trip(pj) == pj


@pytest.mark.parametrize("kind", ["job", "trainjob", "pytorchjob"])
def test_cpu_and_sim_jobs_request_no_device(kind):
    for backend in ("cpu", "sim"):
        docs = job(backend, kind=kind, nproc=2)
        text = json.dumps(docs)
        assert "resources" not in text and "resourcesPerNode" not in text
        selector = {"nodeSelector": {f"{PREFIX}/backend": backend}}
        # the sim is never a node's label: its pods may run on any node
        assert (json.dumps(selector)[1:-1] in text) == (backend == "cpu")
        assert ("nodeSelector" in text) == (backend == "cpu")
        if kind == "job":
            for doc in docs:
                validate(doc)


def test_the_resource_can_be_overridden():
    (_, batch) = job("cambricon", "--resource", "cambricon.com/mlu370")
    container = batch["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"cambricon.com/mlu370": "8"}


def test_namespace_and_name_reach_every_manifest():
    docs = job("ascend", "--name", "llama-ft", "--namespace", "ml")
    assert [(d["metadata"]["name"], d["metadata"]["namespace"]) for d in docs] == [("llama-ft", "ml")] * 2
    for doc in docs:
        validate(doc)


def test_the_validators_catch_a_wrong_manifest():
    # each check above would fail on a manifest that is wrong: a misspelled field, a wrong type
    (_, batch) = job("cuda")
    wrong = copy.deepcopy(batch)
    wrong["spec"]["template"]["spec"]["containers"][0]["imagee"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(wrong)
    (train,) = job("cuda", kind="trainjob")
    wrong = copy.deepcopy(train)
    wrong["spec"]["trainer"]["numProcPerNod"] = 8
    assert trainjob_model_round_trip(wrong) != wrong
    wrong = copy.deepcopy(train)
    wrong["spec"]["trainer"]["numProcPerNode"] = "auto"
    with pytest.raises(ValueError):
        trainjob_model_round_trip(wrong)
    (pj,) = job("cuda", kind="pytorchjob")
    wrong = copy.deepcopy(pj)
    wrong["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["imagee"] = "x"
    assert pytorchjob_model_round_trip(wrong) != wrong


def test_program_arguments_survive_kubernetes_expansion():
    code, out, err = cli("k8s", "job", "--backend", "cuda", "--nodes", "1", "--nproc-per-node", "1",
                         "--image", "img", "--", "train.py", "--tag", "$(HOME)", "a b")
    assert code == 0, err
    (_, batch) = yaml.safe_load_all(out)
    assert batch["spec"]["template"]["spec"]["containers"][0]["command"][-3:] == ["--tag", "$$(HOME)", "a b"]


def test_daemonset_is_valid_and_writes_where_nfd_reads():
    code, out, err = cli("k8s", "daemonset", "--image", "registry.example.com/torchfl:1", "--namespace",
                         "node-feature-discovery", "--interval", "300")
    assert code == 0, err
    (ds,) = yaml.safe_load_all(out)
    validate(ds)
    pod = ds["spec"]["template"]["spec"]
    container = pod["containers"][0]
    features = "/etc/kubernetes/node-feature-discovery/features.d"
    assert container["command"] == ["python", "-m", "flagos_torchfl", "k8s", "labels", "--write", features,
                                    "--prefix", PREFIX, "--interval", "300"]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == features)
    assert {"name": mount["name"], "hostPath": {"path": features, "type": "DirectoryOrCreate"}} in pod["volumes"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in container["env"]  # cuda's kubernetes.probe_env
    assert pod["tolerations"] == [{"operator": "Exists"}]


@pytest.mark.full
def test_the_console_command_prints_the_same_yaml():
    proc = run_python(["-m", "flagos_torchfl", "k8s", "job", "--backend", "xpu", "--nodes", "2",
                       "--nproc-per-node", "8", "--image", "registry.example.com/team/train:1.0", "--",
                       "train.py", "--epochs", "1"])
    assert proc.returncode == 0, proc.stderr
    assert list(yaml.safe_load_all(proc.stdout)) == job("xpu")


# ------------------------------------------------------------------ choosing the pool
def node(name, backend=None, devices=None, unschedulable=False):
    labels = {"kubernetes.io/hostname": name}
    if backend:
        labels[f"{PREFIX}/backend"] = backend
    manifest = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
                "spec": {"unschedulable": True} if unschedulable else {},
                "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **(devices or {})}}}
    validate(manifest)
    return manifest


@pytest.fixture
def cluster(tmp_path):
    nodes = [
        node("gpu-a", "cuda", {"nvidia.com/gpu": "8"}),
        node("gpu-b", "cuda", {"nvidia.com/gpu": "4"}),
        node("npu-a", "ascend", {"huawei.com/Ascend910": "8"}),
        node("npu-b", "ascend", {"huawei.com/Ascend910": "8"}),
        node("npu-c", "ascend", {"huawei.com/Ascend910": "8"}, unschedulable=True),
        node("mlu-a", None, {"cambricon.com/mlu": "8"}),
        node("cpu-a", "cpu"),
    ]
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
    return path


def test_auto_picks_the_pool_with_enough_allocatable_devices_and_says_why(cluster):
    code, out, err = cli("k8s", "job", "--backend", "auto", "--nodes-json", str(cluster), "--nodes", "2",
                         "--nproc-per-node", "8", "--image", "img", "--", "train.py")
    assert code == 0, err
    (service, batch) = yaml.safe_load_all(out)
    assert batch["spec"]["template"]["spec"]["nodeSelector"] == {f"{PREFIX}/backend": "ascend"}
    assert batch["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"huawei.com/Ascend910": "8"}
    assert "ascend: 2 of 2 node(s)" in err and "8 allocatable huawei.com/Ascend910" in err
    assert "cuda: 1 of 2 node(s)" in err  # cuda ranks higher but has one node with 8 GPUs


def test_auto_takes_the_higher_priority_pool_when_both_fit(cluster):
    code, out, err = cli("k8s", "job", "--backend", "auto", "--nodes-json", str(cluster), "--nodes", "2",
                         "--nproc-per-node", "4", "--image", "img", "--kind", "trainjob", "--", "train.py")
    assert code == 0, err
    (train,) = yaml.safe_load_all(out)
    assert train["spec"]["trainer"]["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "4"}
    assert train["metadata"]["name"] == "torchfl-cuda"


def test_a_model_specific_resource_is_found_on_the_nodes(tmp_path):
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"kind": "NodeList", "items": [
        node("p-a", "ascend", {"huawei.com/Ascend310P": "4"}), node("p-b", "ascend", {"huawei.com/Ascend310P": "4"})]}))
    code, out, err = cli("k8s", "job", "--backend", "ascend", "--nodes-json", str(path), "--nodes", "2",
                         "--nproc-per-node", "4", "--image", "img", "--", "train.py")
    assert code == 0, err
    (_, batch) = yaml.safe_load_all(out)
    assert batch["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"huawei.com/Ascend310P": "4"}


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("argv, message", [
    (["--backend", "ascnd"], "unknown backend 'ascnd'. Did you mean 'ascend'? Valid names:"),
    (["--nodes", "0"], "--nodes 0 is not valid: give a number of nodes, 1 or more"),
    (["--nproc-per-node", "0"], "--nproc-per-node 0 is not valid"),
    (["--image", "registry.example.com/my image:1"], "image 'registry.example.com/my image:1' is not valid: "
                                                     "it holds white space"),
    (["--kind", "trainjbo"], "unknown kind 'trainjbo'. Did you mean 'trainjob'? Valid: job, trainjob, pytorchjob"),
    (["--name", "Big_Name"], "--name 'Big_Name' is not valid"),
    (["--name", "x" * 62], "at most 61 characters"),
    (["--resource", "gpu"], "--resource 'gpu' is not valid: give a device-plugin resource name"),
    (["--namespace", "ML"], "namespace 'ML' is not valid"),
    (["--prefix", "kubernetes.io"], "label prefix 'kubernetes.io' is in a namespace NFD does not publish"),
    (["--backend", "auto"], "--backend auto needs --nodes-json FILE"),
    (["--nodes-json", "/nonexistent/nodes.json"], "--nodes-json '/nonexistent/nodes.json' cannot be read"),
])
def test_bad_input_is_a_clear_error_and_prints_no_manifest(argv, message):
    base = {"--backend": "cuda", "--nodes": "2", "--nproc-per-node": "8", "--image": "img"}
    for i in range(0, len(argv), 2):
        base[argv[i]] = argv[i + 1]
    code, out, err = cli("k8s", "job", *[x for kv in base.items() for x in kv], "--", "train.py")
    assert code == 2 and out == ""
    assert message in err, err


def test_a_program_is_required():
    code, out, err = cli("k8s", "job", "--backend", "cuda", "--nodes", "1", "--nproc-per-node", "1", "--image", "x")
    assert code == 2 and out == "" and "no program given" in err


def test_a_nodes_file_without_the_chip_says_what_it_has(cluster):
    code, out, err = cli("k8s", "job", "--backend", "mthreads", "--nodes-json", str(cluster), "--nodes", "1",
                         "--nproc-per-node", "8", "--image", "img", "--", "train.py")
    assert code == 2 and out == ""
    assert f"no node is labelled {PREFIX}/backend=mthreads" in err


def test_a_pool_too_small_says_how_many_nodes_fit(cluster):
    code, out, err = cli("k8s", "job", "--backend", "ascend", "--nodes-json", str(cluster), "--nodes", "3",
                         "--nproc-per-node", "8", "--image", "img", "--", "train.py")
    assert code == 2 and out == ""
    assert "ascend: 2 of 2 node(s)" in err and "has 3 node(s)" in err  # the unschedulable node is not counted


def test_unlabelled_nodes_with_the_chip_are_pointed_out(cluster):
    code, out, err = cli("k8s", "job", "--backend", "cambricon", "--nodes-json", str(cluster), "--nodes", "1",
                         "--nproc-per-node", "8", "--image", "img", "--", "train.py")
    assert code == 2 and out == ""
    assert "1 node(s) have the chip's device resource but no torchfl.flagos.io/backend label" in err


def test_a_file_that_is_not_a_node_list_is_refused(tmp_path):
    path = tmp_path / "pods.json"
    path.write_text(json.dumps({"kind": "PodList", "items": "nope"}))
    code, out, err = cli("k8s", "job", "--backend", "auto", "--nodes-json", str(path), "--nodes", "1",
                         "--nproc-per-node", "1", "--image", "img", "--", "train.py")
    assert code == 2 and out == "" and "is not a node list" in err


# ------------------------------------------------------------------ the YAML writer
TRICKY = ["yes", "No", "on", "null", "~", "", "8", "0x1F", "1e3", "1:30", "-x", "- x", "a: b", "#c", "a #b",
          "*x", "&x", "!x", "%x", "@x", "`x", "{x}", "[x]", "'q'", '"q"', "x\ny", " lead", "trail ", "é",
          "\t", "$(VAR)", ".inf", ".nan", "2026-12-01", "<<", "=", "?", "|", ">", "nvidia.com/gpu", "a,b"]


def test_yaml_writer_round_trips_strings_a_yaml_reader_could_misread():
    document = {"strings": TRICKY, "keys": {s: s for s in TRICKY if s}, "ints": [0, -3, 29500],
                "bools": [True, False], "none": None, "empty": [{}, []], "nested": [[1, [2]], {"a": [{"b": {}}]}]}
    text = emit.dump(document)
    assert yaml.safe_load(text) == document
    assert list(yaml.safe_load_all(emit.dump_all([document, {"b": 1}]))) == [document, {"b": 1}]


def test_yaml_writer_refuses_what_it_cannot_write():
    with pytest.raises(TypeError, match="cannot write float"):
        emit.dump({"x": 1.5})


def test_kubernetes_validate_runs_offline_here():
    # the schemas ship inside the package: no network is involved
    assert kubernetes_validate.utils.latest_version() >= "1.33" and "kubernetes_validate" in sys.modules
