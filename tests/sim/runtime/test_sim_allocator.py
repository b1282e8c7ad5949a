"""The sim's caching allocator: on its own, then as the memory of installed sim devices
(statistics that match the live tensors exactly, caching, limits, storage resizing)."""
from __future__ import annotations

import copy
import gc

import pytest
import torch

import flagos_torchfl.sim as fsim
from flagos_torchfl.sim.runtime.allocator import (BLOCK_ROUND, NOMINAL_TOTAL_MEMORY, SMALL_SEGMENT,
                                          CachingAllocator, round_size)

pytestmark = pytest.mark.isolated

MiB = 1 << 20


def test_round_size():
    assert round_size(0) == 0
    assert round_size(1) == BLOCK_ROUND == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024


def test_zero_bytes_take_no_block():
    alloc = CachingAllocator(0)
    assert alloc.allocate(0) is None
    assert alloc.allocated == alloc.reserved == 0


def test_allocated_is_sum_of_rounded_sizes_and_small_requests_share_a_segment():
    alloc = CachingAllocator(0)
    sizes = [1, 512, 700, 4096, 100_000]
    blocks = [alloc.allocate(n) for n in sizes]
    assert alloc.allocated == sum(round_size(n) for n in sizes)
    assert alloc.reserved == SMALL_SEGMENT  # all of them fit in one 2 MiB small segment
    stats = alloc.stats()
    assert stats["allocation.all.current"] == len(sizes)
    assert stats["requested_bytes.all.current"] == sum(sizes)
    assert stats["segment.small_pool.current"] == 1
    ptrs = sorted(b.ptr for b in blocks)
    assert all(b - a >= 512 for a, b in zip(ptrs, ptrs[1:]))  # no overlap


def test_large_request_gets_its_own_exact_segment():
    alloc = CachingAllocator(0)
    alloc.allocate(3 * MiB + 1)
    assert alloc.allocated == alloc.reserved == round_size(3 * MiB + 1)
    assert alloc.stats()["segment.large_pool.current"] == 1


def test_freed_block_is_cached_and_reused_best_fit():
    alloc = CachingAllocator(0)
    big = alloc.allocate(4 * MiB)
    small = alloc.allocate(3 * MiB)
    alloc.free(big)
    alloc.free(small)
    assert alloc.allocated == 0 and alloc.reserved == 7 * MiB
    again = alloc.allocate(2 * MiB)
    assert again.segment is small.segment  # the 3 MiB block fits best
    assert alloc.reserved == 7 * MiB  # served from the cache
    assert alloc.allocated == 2 * MiB  # the rest of the block was split off and stays cached
    stats = alloc.stats()
    assert stats["num_device_alloc"] == 2 and stats["allocation.all.allocated"] == 3


def test_free_merges_neighbours_and_empty_cache_releases_whole_segments():
    alloc = CachingAllocator(0)
    a, b, c = (alloc.allocate(1024) for _ in range(3))
    alloc.free(a)
    alloc.free(c)
    assert alloc.empty_cache() == 0  # b still lives in the segment
    alloc.free(b)
    assert alloc.reserved == SMALL_SEGMENT
    assert alloc.empty_cache() == SMALL_SEGMENT
    assert alloc.reserved == 0 and alloc.stats()["num_device_free"] == 1


def test_peaks_and_resets():
    alloc = CachingAllocator(0)
    blk = alloc.allocate(5 * MiB)
    alloc.free(blk)
    assert alloc.max_allocated == 5 * MiB and alloc.allocated == 0
    alloc.reset_peak()
    assert alloc.max_allocated == 0 and alloc.max_reserved == 5 * MiB
    alloc.reset_accumulated()
    assert alloc.stats()["allocation.all.allocated"] == 0


def test_limit_empties_cache_then_raises_oom_naming_limit_size_and_device():
    alloc = CachingAllocator(3, limit=8 * MiB)
    alloc.free(alloc.allocate(6 * MiB))  # cached, reserved
    kept = alloc.allocate(7 * MiB)  # needs the cache emptied first
    assert alloc.stats()["num_alloc_retries"] == 1
    with pytest.raises(torch.OutOfMemoryError) as info:
        alloc.allocate(2 * MiB)
    msg = str(info.value)
    assert "sim:3" in msg and "2.00 MiB" in msg and str(2 * MiB) in msg
    assert "limit" in msg and str(8 * MiB) in msg
    assert alloc.stats()["num_ooms"] == 1
    assert alloc.allocated == 7 * MiB and kept.size == 7 * MiB


def test_small_segment_shrinks_to_what_the_limit_leaves():
    alloc = CachingAllocator(0, limit=MiB)
    alloc.allocate(100)
    assert alloc.reserved == MiB
    with pytest.raises(torch.OutOfMemoryError):
        alloc.allocate(2 * MiB)


def test_capacity_is_limit_or_nominal():
    alloc = CachingAllocator(0)
    assert alloc.capacity == NOMINAL_TOTAL_MEMORY == 16 << 30
    alloc.set_limit(123 * MiB)
    assert alloc.capacity == 123 * MiB


def test_double_free_is_refused():
    alloc = CachingAllocator(0)
    blk = alloc.allocate(10)
    alloc.free(blk)
    with pytest.raises(RuntimeError, match="double free"):
        alloc.free(blk)


# -- the allocator behind installed sim devices ------------------------------
@pytest.fixture(scope="module")
def sim():
    return fsim.install(num_devices=1)


@pytest.fixture
def clean(sim):
    gc.collect()
    sim.empty_cache()
    assert sim.memory_allocated() == 0, "a previous test leaked sim tensors"
    sim.reset_peak_memory_stats()
    sim.reset_accumulated_memory_stats()
    yield sim
    fsim.set_memory_limit(None)


def _rounded(*tensors):
    storages = {t.untyped_storage()._cdata: t.untyped_storage().nbytes() for t in tensors}
    return sum(round_size(n) for n in storages.values())


def test_allocated_matches_live_tensors_exactly(clean):
    sim = clean
    a = torch.empty(10, device="sim")  # 40 bytes -> 512
    b = torch.zeros(1000, 3, device="sim")  # 12000 -> 12288
    c = torch.arange(300_000, device="sim")  # int64, 2.4 MB -> large pool
    views = [a[2:], b.t(), c.view(1000, 300), b.detach(), torch.nn.Parameter(b)]
    assert sim.memory_allocated() == _rounded(a, b, c) == 512 + 12288 + round_size(2_400_000)
    assert all(v.untyped_storage().data_ptr() in (a.data_ptr(), b.data_ptr(), c.data_ptr())
               for v in views)
    stats = sim.memory_stats()
    assert stats["allocated_bytes.all.current"] == sim.memory_allocated()
    assert stats["allocation.all.current"] == 3
    assert stats["requested_bytes.all.current"] == 40 + 12000 + 2_400_000
    del a, b, views
    assert sim.memory_allocated() == _rounded(c)
    del c
    assert sim.memory_allocated() == 0
    assert sim.max_memory_allocated() == 512 + 12288 + round_size(2_400_000)
    assert sim.memory_stats()["allocation.all.freed"] == 3


def test_results_of_operators_are_accounted(clean):
    sim = clean
    x = torch.randn(64, 64, device="sim")
    y = x @ x
    z = torch.cat([x, y])
    assert sim.memory_allocated() == _rounded(x, y, z)
    del x, y, z
    assert sim.memory_allocated() == 0


def test_freed_memory_is_cached_and_reused(clean):
    sim = clean
    t = torch.empty(3 * MiB, dtype=torch.uint8, device="sim")
    reserved = sim.memory_reserved()
    assert reserved == 3 * MiB
    del t
    assert sim.memory_allocated() == 0 and sim.memory_reserved() == reserved
    u = torch.empty(3 * MiB, dtype=torch.uint8, device="sim")
    assert sim.memory_reserved() == reserved  # served from the cache
    assert sim.memory_stats()["num_device_alloc"] == 1
    del u
    sim.empty_cache()
    assert sim.memory_reserved() == 0
    assert sim.memory_stats()["num_device_free"] == 1


def test_mem_get_info(clean):
    sim = clean
    free, total = sim.mem_get_info()
    assert total == 16 << 30 and free == total - sim.memory_reserved()
    fsim.set_memory_limit(64 * MiB)
    assert sim.mem_get_info() == (64 * MiB - sim.memory_reserved(), 64 * MiB)
    assert sim.get_device_properties().total_memory == 64 * MiB


def test_memory_limit_raises_out_of_memory(clean):
    sim = clean
    fsim.set_memory_limit(8 * MiB)
    keep = torch.empty(5 * MiB, dtype=torch.uint8, device="sim")
    with pytest.raises(torch.OutOfMemoryError) as info:
        torch.empty(4 * MiB, dtype=torch.uint8, device="sim")
    msg = str(info.value)
    assert "sim:0" in msg and "4.00 MiB" in msg and "8.00 MiB" in msg and "limit" in msg
    assert sim.memory_stats()["num_ooms"] == 1
    fsim.set_memory_limit(None)
    more = torch.empty(4 * MiB, dtype=torch.uint8, device="sim")
    assert sim.memory_allocated() == 9 * MiB
    del keep, more


def test_limit_empties_the_cache_before_giving_up(clean):
    sim = clean
    fsim.set_memory_limit(8 * MiB)
    t = torch.empty(6 * MiB, dtype=torch.uint8, device="sim")
    del t  # 6 MiB cached
    u = torch.empty(7 * MiB, dtype=torch.uint8, device="sim")
    assert sim.memory_stats()["num_alloc_retries"] == 1
    assert sim.memory_reserved() == 7 * MiB
    del u


def test_tensor_resize_grows_shared_storage_in_place(clean):
    sim = clean
    t = torch.arange(4.0, device="sim")
    alias = t[:]
    t.resize_(1000)
    assert alias.untyped_storage().nbytes() == 4000  # every sharer sees the new memory
    assert t[:4].cpu().tolist() == [0, 1, 2, 3]
    assert sim.memory_allocated() == round_size(4000)
    t.resize_(2, 2)
    assert t.cpu().tolist() == [[0, 1], [2, 3]]
    del t, alias


def test_storage_api_on_sim(clean):
    sim = clean
    s = torch.UntypedStorage(100, device="sim")
    assert s.device == torch.device("sim:0") and s.nbytes() == 100
    assert sim.memory_allocated() == 512
    s.resize_(2000)
    assert s.nbytes() == 2000 and sim.memory_allocated() == 2048
    s.resize_(0)
    assert sim.memory_allocated() == 0
    assert s.new().device == s.device
    cpu = torch.UntypedStorage(8)
    cpu.fill_(7)
    moved = cpu.to(device="sim")
    assert moved.device.type == "sim" and moved.cpu().tolist() == [7] * 8
    assert moved.clone().cpu().tolist() == [7] * 8
    del s, moved


def test_deepcopy_of_a_model_copies_device_memory(clean):
    sim = clean
    model = torch.nn.Linear(16, 16).to("sim")
    before = sim.memory_allocated()
    twin = copy.deepcopy(model)
    assert sim.memory_allocated() == 2 * before
    assert twin.weight.data_ptr() != model.weight.data_ptr()
    assert torch.equal(twin.weight.cpu(), model.weight.cpu())
    del model, twin
