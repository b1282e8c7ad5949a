"""``torch.distributed.ProcessGroupNCCL`` under activation on the cpu backend, in a world of one
process: where torch has no NCCL, a stand-in whose instances are the chip's collective's
backends and whose ``Options()`` carry NCCL's attributes; ``init_process_group("nccl",
pg_options=...)`` and ``new_group(pg_options=...)`` accept NCCL's options, and deactivation
removes the stand-in."""
from __future__ import annotations

import json
from importlib import resources

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import flagos_torchfl as ft


pytestmark = pytest.mark.skipif(
    not __import__("flagos_torchfl").compat.has("library_get_kernel"),
    reason="torch 2.1 lacks what these entry points are (torch.library.get_kernel, torch.get_autocast_dtype, torch.nn.attention, ProfilerActivity.PrivateUse1, Storage.to) or what the tests read")

BUILT_WITH_NCCL = hasattr(torch._C._distributed_c10d, "ProcessGroupNCCL")
TABLE = json.loads(resources.files("flagos_torchfl").joinpath("data/nccl_options.json").read_text("utf-8"))
without_nccl = pytest.mark.skipif(BUILT_WITH_NCCL, reason="this torch has ProcessGroupNCCL")


@pytest.fixture
def world(cpu_backend):
    """A process group of one process, created as CUDA code creates it."""
    def start(**options):
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, **options)
        return dist.group.WORLD

    yield start
    if dist.is_initialized():
        dist.destroy_process_group()


@without_nccl
def test_the_stand_in_is_what_is_nccl_available_promises(cpu_backend):
    from torch.distributed import ProcessGroupNCCL
    from torch.distributed.distributed_c10d import ProcessGroupNCCL as same

    assert dist.is_nccl_available() and same is ProcessGroupNCCL
    with pytest.raises(RuntimeError, match="run on the collective 'gloo' of backend 'cpu'"):
        ProcessGroupNCCL(dist.HashStore(), 0, 1)
    ft.deactivate()
    assert not hasattr(dist, "ProcessGroupNCCL") and not hasattr(c10d, "ProcessGroupNCCL")


@without_nccl
def test_options_carry_nccls_attributes(cpu_backend):
    options = dist.ProcessGroupNCCL.Options()
    expected = dict(TABLE["options"])
    assert isinstance(options, torch._C._distributed_c10d.Backend.Options)
    assert options._timeout.total_seconds() == expected.pop("timeout_seconds")
    assert {name: getattr(options, name) for name in expected} == expected
    assert {name: getattr(options.config, name) for name in TABLE["config"]} == TABLE["config"]
    assert dist.ProcessGroupNCCL.Options(is_high_priority_stream=True).is_high_priority_stream
    assert dist.ProcessGroupNCCL.Options().global_ranks_in_group is not options.global_ranks_in_group
    options.config.cta_policy = dist.ProcessGroupNCCL.NCCL_CTA_POLICY_ZERO
    with pytest.raises(AttributeError, match="no attribute 'cta_polcy'"):
        options.config.cta_polcy = 2


@pytest.mark.skipif(not BUILT_WITH_NCCL, reason="this torch has no ProcessGroupNCCL to read the table from")
def test_the_table_is_torchs():
    nccl = torch._C._distributed_c10d.ProcessGroupNCCL
    options, config = nccl.Options(), nccl.NCCLConfig()
    expected = dict(TABLE["options"])
    assert options._timeout.total_seconds() == expected.pop("timeout_seconds")
    public = {n for n in dir(options) if not n.startswith("_") and not callable(getattr(options, n))}
    assert public == set(expected) | {"config"}
    assert {n: getattr(options, n) for n in expected} == expected
    fields = {n for n in dir(config) if not n.startswith("_") and not callable(getattr(config, n))}
    assert {n: getattr(config, n) for n in fields} == TABLE["config"]
    assert {n: getattr(nccl, n) for n in dir(nccl) if n.startswith("NCCL_")} == TABLE["constants"]


def test_nccl_options_are_accepted_by_init_process_group_and_new_group(world):
    options = dist.ProcessGroupNCCL.Options()
    options.is_high_priority_stream = True
    group = world(pg_options=options)
    assert dist.get_backend() == "gloo"
    sub = dist.new_group([0], pg_options=options)
    tensor = torch.ones(3, device="cuda")
    dist.all_reduce(tensor, group=sub)
    assert tensor.tolist() == [1.0] * 3 and group is dist.group.WORLD


@without_nccl
def test_the_chips_backend_is_an_instance(world):
    group = world()
    backend = group._get_backend(torch.device("cpu"))
    assert isinstance(backend, dist.ProcessGroupNCCL)
    assert isinstance(dist.new_group([0])._get_backend(torch.device("cpu")), dist.ProcessGroupNCCL)
    assert not isinstance(group, dist.ProcessGroupNCCL)  # a ProcessGroup is none, as with NCCL
    assert not isinstance(torch.ones(1), dist.ProcessGroupNCCL)
    dist.destroy_process_group()
    assert not isinstance(backend, dist.ProcessGroupNCCL)  # no live group runs on it


@pytest.mark.skipif(not BUILT_WITH_NCCL, reason="this torch has no ProcessGroupNCCL")
def test_a_cuda_build_keeps_its_own_class(world):
    group = world()
    assert dist.ProcessGroupNCCL is torch._C._distributed_c10d.ProcessGroupNCCL
    assert not isinstance(group._get_backend(torch.device("cpu")), dist.ProcessGroupNCCL)
