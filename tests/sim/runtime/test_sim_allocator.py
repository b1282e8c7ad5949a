"""The sim's caching allocator: on its own (both implementations: the Python runtime's and the C++
runtime's, one policy), then as the memory of installed sim devices (statistics that match the
live tensors exactly, caching, limits, storage resizing)."""
from __future__ import annotations

import contextlib
import copy
import gc
import threading

import pytest
import torch

import flagos_torchfl.sim as fsim
from flagos_torchfl.sim.runtime import cpp
from flagos_torchfl.sim.runtime.allocator import (BLOCK_ROUND, NOMINAL_TOTAL_MEMORY, SMALL_SEGMENT,
                                                  CachingAllocator, round_size)

pytestmark = pytest.mark.isolated

MiB = 1 << 20


def test_round_size():
    assert round_size(0) == 0
    assert round_size(1) == BLOCK_ROUND == 512
    assert round_size(512) == 512
    assert round_size(513) == 1024


@pytest.fixture(params=["python", "cpp"])
def make(request):
    """The allocator class of either runtime: ``make(index, limit=None)``."""
    if request.param == "python":
        return CachingAllocator
    try:
        return cpp.load().new_allocator
    except cpp.CppUnavailable as exc:
        pytest.skip(f"no C++ runtime here: {exc}")


def test_zero_bytes_take_no_block(make):
    alloc = make(0)
    assert alloc.allocate(0) is None
    assert alloc.allocated == alloc.reserved == 0


def test_allocated_is_sum_of_rounded_sizes_and_small_requests_share_a_segment(make):
    alloc = make(0)
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


def test_large_request_gets_its_own_exact_segment(make):
    alloc = make(0)
    alloc.allocate(3 * MiB + 1)
    assert alloc.allocated == alloc.reserved == round_size(3 * MiB + 1)
    assert alloc.stats()["segment.large_pool.current"] == 1


def test_freed_block_is_cached_and_reused_best_fit(make):
    alloc = make(0)
    big = alloc.allocate(4 * MiB)
    small = alloc.allocate(3 * MiB)
    alloc.free(big)
    alloc.free(small)
    assert alloc.allocated == 0 and alloc.reserved == 7 * MiB
    again = alloc.allocate(2 * MiB)
    assert again.ptr == small.ptr  # the 3 MiB block fits best; its head is handed out
    assert alloc.reserved == 7 * MiB  # served from the cache
    assert alloc.allocated == 2 * MiB  # the rest of the block was split off and stays cached
    stats = alloc.stats()
    assert stats["num_device_alloc"] == 2 and stats["allocation.all.allocated"] == 3


def test_free_merges_neighbours_and_empty_cache_releases_whole_segments(make):
    alloc = make(0)
    a, b, c = (alloc.allocate(1024) for _ in range(3))
    alloc.free(a)
    alloc.free(c)
    assert alloc.empty_cache() == 0  # b still lives in the segment
    alloc.free(b)
    assert alloc.reserved == SMALL_SEGMENT
    assert alloc.empty_cache() == SMALL_SEGMENT
    assert alloc.reserved == 0 and alloc.stats()["num_device_free"] == 1


def test_peaks_and_resets(make):
    alloc = make(0)
    blk = alloc.allocate(5 * MiB)
    alloc.free(blk)
    assert alloc.max_allocated == 5 * MiB and alloc.allocated == 0
    alloc.reset_peak()
    assert alloc.max_allocated == 0 and alloc.max_reserved == 5 * MiB
    alloc.reset_accumulated()
    assert alloc.stats()["allocation.all.allocated"] == 0


def test_limit_empties_cache_then_raises_oom_naming_limit_size_and_device(make):
    alloc = make(3, limit=8 * MiB)
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


def test_small_segment_shrinks_to_what_the_limit_leaves(make):
    alloc = make(0, limit=MiB)
    alloc.allocate(100)
    assert alloc.reserved == MiB
    with pytest.raises(torch.OutOfMemoryError):
        alloc.allocate(2 * MiB)


def test_capacity_is_limit_or_nominal(make):
    alloc = make(0)
    assert alloc.capacity == NOMINAL_TOTAL_MEMORY == 16 << 30
    alloc.set_limit(123 * MiB)
    assert alloc.capacity == 123 * MiB


def test_double_free_is_refused(make):
    alloc = make(0)
    blk = alloc.allocate(10)
    alloc.free(blk)
    with pytest.raises(RuntimeError, match="double free"):
        alloc.free(blk)


def test_graph_pools_keep_their_memory_apart_until_no_graph_uses_them(make):
    alloc = make(0)
    own = alloc.allocate(1000)
    alloc.free(own)  # a cached block of the device's own small pool
    token = (7, 0)
    with pytest.raises(RuntimeError, match=r"graph pool \(7, 0\) of sim:0 is not in use"):
        with alloc.allocating_to(token):
            pass
    alloc.retain_pool(token)
    with alloc.allocating_to(token):
        inside = alloc.allocate(1000)
    assert inside.ptr != own.ptr  # the device's cached block is not the pool's
    assert alloc.pool_reserved(token) == SMALL_SEGMENT
    assert alloc.reserved == 2 * SMALL_SEGMENT and alloc.stats()["segment.all.current"] == 2
    outside = alloc.allocate(1000)
    assert outside.ptr == own.ptr  # eager requests never get pool memory
    alloc.free(inside)
    with alloc.allocating_to(token):
        again = alloc.allocate(1000)
    assert again.ptr == inside.ptr  # the pool's freed block serves the next capture
    alloc.free(again)
    assert alloc.empty_cache() == 0  # a graph still uses the pool
    alloc.release_pool(token)
    with pytest.raises(RuntimeError, match="not in use"):
        alloc.release_pool(token)
    alloc.free(outside)
    assert alloc.empty_cache() == 2 * SMALL_SEGMENT
    assert alloc.pool_reserved(token) == 0 and alloc.reserved == 0


def test_a_pool_route_is_the_calling_threads_only(make):
    alloc = make(0)
    token = (3, 1)
    alloc.retain_pool(token)
    seen = {}
    entered, done = threading.Event(), threading.Event()

    def other_thread():
        entered.wait()
        seen["other"] = alloc.allocate(100)
        done.set()

    worker = threading.Thread(target=other_thread)
    worker.start()
    with alloc.allocating_to(token):
        seen["mine"] = alloc.allocate(100)
        entered.set()
        done.wait()
    worker.join()
    assert alloc.pool_reserved(token) == SMALL_SEGMENT  # only this thread's request
    assert alloc.reserved == 2 * SMALL_SEGMENT
    for block in seen.values():
        alloc.free(block)


def test_fraction_bounds_new_segments_with_cudas_errors(make):
    alloc = make(1, limit=64 * MiB)
    with pytest.raises(TypeError, match="must be `float`"):
        alloc.set_fraction(1)
    with pytest.raises(ValueError, match="Allowed range: 0~1"):
        alloc.set_fraction(1.5)
    assert alloc.fraction == 1.0
    alloc.set_fraction(0.25)
    assert alloc.fraction == 0.25 and alloc.allowed == 16 * MiB
    kept = alloc.allocate(15 * MiB)
    with pytest.raises(torch.OutOfMemoryError) as info:
        alloc.allocate(2 * MiB)
    assert "of which this process may use 0.25 (16.00 MiB, set_per_process_memory_fraction)" in str(info.value)
    assert "sim:1" in str(info.value)
    alloc.free(kept)


def test_both_implementations_agree_on_a_long_random_sequence():
    """One sequence of requests, releases, cache emptying and a graph pool, given to both
    allocators: every statistic after every step is the same, and so are each block's size and
    each out-of-memory message."""
    import random

    try:
        twin = cpp.load().new_allocator(0, 48 * MiB)
    except cpp.CppUnavailable as exc:
        pytest.skip(f"no C++ runtime here: {exc}")
    python = CachingAllocator(0, 48 * MiB)
    rng = random.Random(5)
    live = []
    token = (11, 0)
    for step in range(3000):
        pool = step % 97 < 10  # a capture: requests go to the graph pool
        if step % 97 == 0:
            python.retain_pool(token)
            twin.retain_pool(token)
        elif step % 97 == 10:
            python.release_pool(token)
            twin.release_pool(token)
        roll = rng.random()
        if roll < 0.5 or not live:
            nbytes = rng.choice([rng.randrange(1, 4096), rng.randrange(4096, 1 << 20),
                                 rng.randrange(1 << 20, 6 << 20)])
            outcome = []
            for alloc in (python, twin):
                try:
                    with alloc.allocating_to(token) if pool else contextlib.nullcontext():
                        outcome.append(alloc.allocate(nbytes))
                except torch.OutOfMemoryError as exc:
                    outcome.append(str(exc))
            if isinstance(outcome[0], str):
                assert outcome[0] == outcome[1]  # the same message, word for word
            else:
                assert outcome[0].size == outcome[1].size
                live.append(outcome)
        elif roll < 0.97:
            pair = live.pop(rng.randrange(len(live)))
            python.free(pair[0])
            twin.free(pair[1])
        else:
            assert python.empty_cache() == twin.empty_cache()
        assert python.stats() == twin.stats(), f"statistics differ after step {step}"
    assert python.stats()["num_ooms"] > 0 and python.stats()["num_alloc_retries"] > 0
    for pair in live:
        python.free(pair[0])
        twin.free(pair[1])
    assert python.empty_cache() == twin.empty_cache()
    assert python.stats() == twin.stats() and twin.reserved == 0


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
