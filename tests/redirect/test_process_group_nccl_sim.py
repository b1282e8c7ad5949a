"""``torch.distributed.ProcessGroupNCCL`` on the sim (a module of its own process: the sim claims
PrivateUse1), in a world of one process: the backend a group runs on the sim's device (the
``simccl`` collective) is an instance, the gloo backend the same group runs on the host is not,
and NCCL's options are accepted."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import flagos_torchfl as ft

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]
BUILT_WITH_NCCL = hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL")


@pytest.fixture
def group(monkeypatch):
    monkeypatch.setenv("FL_BACKEND", "sim")
    ft.deactivate()
    ft.auto_select_backend()
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    dist.init_process_group("cpu:gloo,cuda:nccl", store=dist.HashStore(), rank=0, world_size=1,
                            pg_options=options)
    yield dist.group.WORLD
    dist.destroy_process_group()
    ft.deactivate()


@pytest.mark.skipif(BUILT_WITH_NCCL, reason="this torch keeps its own ProcessGroupNCCL")
def test_the_sims_collective_is_nccls_stand_in(group):
    assert dist.get_backend() == "cpu:gloo,sim:simccl"
    assert isinstance(group._get_backend(torch.device("sim")), dist.ProcessGroupNCCL)
    assert not isinstance(group._get_backend(torch.device("cpu")), dist.ProcessGroupNCCL)


def test_collectives_run_with_nccls_options(group):
    options = dist.ProcessGroupNCCL.Options()
    sub = dist.new_group([0], backend="nccl", pg_options=options)
    tensor = torch.full((2,), 3.0, device="cuda")
    dist.all_reduce(tensor, group=sub)
    assert tensor.device.type == "sim" and tensor.tolist() == [3.0, 3.0]
