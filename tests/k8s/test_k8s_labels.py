"""``k8s labels``: this node's labels as Node Feature Discovery's local source reads them (the
file is parsed here as NFD's ``parseFeatureFile`` does), each a valid Kubernetes label; written
atomically; and rewritten every ``--interval``."""
from __future__ import annotations

import json
import os
import random
import re
import sys
import subprocess
import time
import uuid
from datetime import datetime, timezone

import pytest

from flagos_torchfl.errors import ConfigError
from flagos_torchfl.k8s import labels
from tests.helpers import MARK_VARIABLE, clean_env, kill_tree, run_python

PREFIX = "torchfl.flagos.io"
# k8s.io/apimachinery/pkg/util/validation: qualified names and label values
NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def nfd_parse(text: str) -> dict:
    """NFD's local source on one feature file (source/local/local.go, parseFeatureFile): lines
    trimmed, blank ones skipped, ``#`` lines are comments (``# +expiry-time=RFC3339`` ends the
    labels after it once past), ``KEY=VALUE`` split at the first ``=``, ``KEY`` alone is "true"."""
    found, expired = {}, False
    for raw in text.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            if line.startswith("# +expiry-time="):
                expired = datetime.fromisoformat(line.split("=", 1)[1].strip()) < datetime.now(timezone.utc)
            continue
        if expired:
            continue
        key, _, value = line.partition("=")
        found[key] = value if "=" in line else "true"
    return found


def valid_label(key: str, value: str) -> bool:
    prefix, _, name = key.rpartition("/")
    return (len(name) <= 63 and NAME.fullmatch(name) is not None and len(prefix) <= 253
            and SUBDOMAIN.fullmatch(prefix) is not None and len(value) <= 63 and VALUE.fullmatch(value) is not None)


def test_the_nfd_parser_here_reads_nfd_files_as_nfd_does():
    # the cases of NFD's test data (source/local/testdata/features.d): comments, a bare key, expiry
    text = "# comment\nlabel1=value1\n  label2  \n\n# +expiry-time=2000-01-01T00:00:00Z\nold=gone\n"
    assert nfd_parse(text) == {"label1": "value1", "label2": "true"}


@pytest.fixture(scope="module")
def detect_cpu():
    proc = run_python(["-m", "flagos_torchfl", "detect", "--json"])
    assert proc.returncode == 0, proc.stderr
    return next(r for r in json.loads(proc.stdout)["backends"] if r["name"] == "cpu")


def test_labels_on_this_machine_say_backend_cpu(detect_cpu):
    proc = run_python(["-m", "flagos_torchfl", "k8s", "labels"])
    assert proc.returncode == 0, proc.stderr
    found = nfd_parse(proc.stdout)
    assert found[f"{PREFIX}/backend"] == "cpu"
    assert found[f"{PREFIX}/device-count"] == "1"
    assert found[f"{PREFIX}/device-model"] == labels.label_value(detect_cpu["devices"][0]["name"])
    assert found[f"{PREFIX}/device-memory-mib"] == str(detect_cpu["devices"][0]["total_memory"] >> 20)
    assert found[f"{PREFIX}/low-precision-dtype"] == "bfloat16"
    assert found[f"{PREFIX}/runtime-version"] == labels.label_value(detect_cpu["runtime"])
    import torch

    assert found[f"{PREFIX}/torch-version"] == labels.label_value(torch.__version__)
    assert f"{PREFIX}/driver-version" not in found  # unknown values are left out, not invented
    for key, value in found.items():
        assert key.startswith(f"{PREFIX}/") and valid_label(key, value), (key, value)


def test_labels_come_from_the_same_probe_as_detect():
    proc = run_python(["-m", "flagos_torchfl", "k8s", "labels", "--prefix", "feature.node.kubernetes.io"],
                      env={"FL_CPU_DEVICES": "3"})
    assert proc.returncode == 0, proc.stderr
    assert nfd_parse(proc.stdout)["feature.node.kubernetes.io/device-count"] == "3"


def test_write_puts_the_file_nfd_reads_atomically(tmp_path):
    folder = tmp_path / "features.d"
    proc = run_python(["-m", "flagos_torchfl", "k8s", "labels", "--write", str(folder)])
    assert proc.returncode == 0, proc.stderr
    path = folder / "flagos-torchfl"
    assert proc.stdout.strip() == str(path)
    assert sorted(os.listdir(folder)) == ["flagos-torchfl"]  # no temporary file left behind
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert nfd_parse(path.read_text())[f"{PREFIX}/backend"] == "cpu"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    labels.write("a/b=1\n", str(tmp_path))
    with pytest.raises(UnicodeEncodeError):  # the fault: text the ASCII file cannot take, mid-write
        labels.write("a/b=2\nbad=\u00e9\n", str(tmp_path))
    assert os.listdir(tmp_path) == ["flagos-torchfl"]
    assert (tmp_path / "flagos-torchfl").read_text() == "a/b=1\n"


def test_write_to_a_path_that_is_a_file_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    proc = run_python(["-m", "flagos_torchfl", "k8s", "labels", "--write", str(blocker)])
    assert proc.returncode == 1 and proc.stdout == ""
    assert f"k8s labels: cannot write {blocker}" in proc.stderr


def test_interval_rewrites_the_file(tmp_path):
    path = tmp_path / "flagos-torchfl"
    mark = uuid.uuid4().hex
    with open(tmp_path.parent / "interval.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flagos_torchfl", "k8s", "labels", "--write", str(tmp_path), "--interval", "1"],
            env={**clean_env(), MARK_VARIABLE: mark}, stdout=log, stderr=log, start_new_session=True)
        seen = []
        try:
            deadline = time.monotonic() + 80
            while len(seen) < 2 and time.monotonic() < deadline and proc.poll() is None:
                if path.exists():
                    seen.append(nfd_parse(path.read_text())[f"{PREFIX}/backend"])
                    path.unlink()  # the next pass must write it again
                time.sleep(0.2)
        finally:
            kill_tree(mark)
            proc.wait()
    assert seen == ["cpu", "cpu"], (tmp_path.parent / "interval.log").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--interval", "5"], "--interval needs --write DIR"),
    (["--write", "/tmp/x", "--interval", "0"], "--interval needs --write DIR and a number of seconds, 1 or more"),
    (["--prefix", "Bad_Prefix"], "label prefix 'Bad_Prefix' is not valid"),
    (["--prefix", "node.kubernetes.io"], "is in a namespace NFD does not publish labels in"),
])
def test_bad_label_options_are_clear_errors(argv, message):
    proc = run_python(["-m", "flagos_torchfl", "k8s", "labels", *argv])
    assert proc.returncode == 2 and proc.stdout == ""
    assert message in proc.stderr


@pytest.mark.parametrize("text, value", [
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
    ("Ascend910B (64 GB)", "Ascend910B-64-GB"),
    ("torch 2.13.0+cpu", "torch-2.13.0-cpu"),
    ("--x--", "x"),
    ("_.lead", "lead"),
    ("", ""),
    ("\u00e9\u00e8", ""),
    ("a" * 80, "a" * 63),
    ("a" * 62 + "-b", "a" * 62),  # cut to 63, then not ending on '-'
])
def test_label_values_are_made_valid(text, value):
    assert labels.label_value(text) == value


def test_any_text_becomes_a_valid_label_value():
    rng = random.Random(20)
    alphabet = "aZ09._- +/:()\u00e9\t#="
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 90)))
        value = labels.label_value(text)
        assert len(value) <= 63 and VALUE.fullmatch(value), (text, value)


def test_label_names_are_valid_and_unknown_values_left_out():
    row = {"name": "ascend", "devices": [{"name": "Ascend910B3", "total_memory": 64 << 30}] * 8,
           "low_precision_dtype": "float16", "plugin": "torch_npu", "runtime": "2.1.0.post8", "driver": None}
    found = labels.node_labels(row, "2.1.0", "0.1.0")
    assert found == {"backend": "ascend", "device-count": "8", "device-model": "Ascend910B3",
                     "device-memory-mib": "65536", "low-precision-dtype": "float16", "plugin": "torch_npu",
                     "plugin-version": "2.1.0.post8", "torch-version": "2.1.0", "torchfl-version": "0.1.0"}
    text = labels.render(found)
    assert nfd_parse(text) == {f"{PREFIX}/{k}": v for k, v in found.items()}
    assert all(valid_label(k, v) for k, v in nfd_parse(text).items())
    with pytest.raises(ConfigError):
        labels.render(found, "k8s.io")
