"""NVIDIA's environment variables reaching a chip's own (``machine/environment.py``, the table
``data/cuda_environment.json``): the user's own value wins, values are converted where the units
differ, a value the chip cannot take is left alone with a warning, a child re-translates what its
parent set from its own value, and the undo restores the environment exactly."""
from __future__ import annotations

import json
import logging
from importlib import resources

import pytest

from flagos_torchfl.backends import registry
from flagos_torchfl.machine import environment
from flagos_torchfl.backends import registry


def rules(chip: str):
    return environment.counterparts(chip)


def test_the_issue_s_variables_reach_ascend_and_moore_threads():
    env = {"NCCL_SOCKET_IFNAME": "lo", "CUDA_LAUNCH_BLOCKING": "1"}
    before = dict(env)
    undo = environment.translate(rules("ascend"), env)
    assert env["HCCL_SOCKET_IFNAME"] == "lo" and env["ASCEND_LAUNCH_BLOCKING"] == "1"
    undo()
    assert env == before
    environment.translate(rules("mthreads"), env)
    assert env["MCCL_SOCKET_IFNAME"] == "lo" and env["MUSA_LAUNCH_BLOCKING"] == "1"


def test_a_variable_the_user_set_wins():
    env = {"NCCL_SOCKET_IFNAME": "lo", "HCCL_SOCKET_IFNAME": "eth0"}
    assert environment.translate(rules("ascend"), env) is None
    assert env["HCCL_SOCKET_IFNAME"] == "eth0"


def test_the_first_set_source_is_read_and_values_are_converted():
    env = {"NCCL_BLOCKING_WAIT": "1", "NCCL_BUFFSIZE": str(4 * (1 << 20) + 1), "CUDA_LAUNCH_BLOCKING": "7"}
    environment.translate(rules("ascend"), env)
    assert env["TORCH_HCCL_BLOCKING_WAIT"] == "1"  # the legacy NCCL name, read after TORCH_NCCL_'s
    assert env["HCCL_BUFFSIZE"] == "5"  # bytes -> MiB, rounded up (HCCL takes MB)
    assert env["ASCEND_LAUNCH_BLOCKING"] == "1"  # torch_npu accepts 0 or 1 only
    env = {"TORCH_NCCL_BLOCKING_WAIT": "0", "NCCL_BLOCKING_WAIT": "1", "CUDA_LAUNCH_BLOCKING": "0"}
    environment.translate(rules("ascend"), env)
    assert env["TORCH_HCCL_BLOCKING_WAIT"] == "0" and env["ASCEND_LAUNCH_BLOCKING"] == "0"


def test_a_value_the_chip_cannot_take_is_left_alone_with_a_warning(caplog):
    env = {"NCCL_BUFFSIZE": "lots"}
    package = logging.getLogger("flagos_torchfl")  # it does not propagate to the root logger
    package.addHandler(caplog.handler)
    try:
        assert environment.translate(rules("ascend"), env) is None
    finally:
        package.removeHandler(caplog.handler)
    assert "HCCL_BUFFSIZE" not in env
    assert "NCCL_BUFFSIZE='lots' is not translated to HCCL_BUFFSIZE" in caplog.text


def test_a_child_translates_again_from_its_own_value():
    parent = {"NCCL_SOCKET_IFNAME": "lo"}
    environment.translate(rules("ascend"), parent)
    child = dict(parent, NCCL_SOCKET_IFNAME="eth1")  # inherited, then the child's own value
    undo = environment.translate(rules("ascend"), child)
    assert child["HCCL_SOCKET_IFNAME"] == "eth1"
    undo()
    assert child["HCCL_SOCKET_IFNAME"] == "lo" and child[environment.MARK] == parent[environment.MARK]


def test_each_chip_s_rules_are_its_backend_s_and_every_rule_names_its_source():
    data = json.loads(resources.files("flagos_torchfl").joinpath("data/cuda_environment.json").read_text())
    for chip in data["chips"]:
        backend = registry().get(chip)
        assert backend.cuda_environment() == rules(chip) and rules(chip)
        assert registry().profile(chip).cuda_environment() == rules(chip)  # the profile's are its chip's
        for rule in rules(chip):
            assert rule.source and rule.value in ("same", "zero_or_one", "bytes_to_mib")
            assert all(name.startswith(("NCCL_", "TORCH_NCCL_", "CUDA_")) for name in rule.sources)
    assert registry().get("cpu").cuda_environment() == () == registry().get("cuda").cuda_environment()


@pytest.mark.parametrize("value", ["", "-3", "x"])
def test_buffer_sizes_that_are_no_positive_byte_count_are_refused(value):
    rule = next(r for r in rules("ascend") if r.target == "HCCL_BUFFSIZE")
    assert rule.convert(value) is None
