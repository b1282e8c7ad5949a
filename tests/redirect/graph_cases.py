"""The cases of CUDA graphs and ``torch.compile(mode="reduce-overhead")`` on a backend: capture
and replay through ``torch.cuda`` (PyTorch's documentation examples: whole-network capture of a
training step, partial capture with ``make_graphed_callables``), what a capture refuses and with
which message, random operators drawing fresh numbers at each replay (and none at the
capture), pools shared between
graphs (on a device with its own allocator: the memory a pool holds, reused and given back), and
the compiled path. A module that imports them names its backend (``BACKEND``) and
its sim profile (``PROFILE``, None: none); the sim's modules run in fresh interpreters."""
from __future__ import annotations

import copy
import importlib.util
import os
import threading

import pytest
import torch

import flagos_torchfl as ft

REFUSED = "operation not permitted when stream is capturing"


@pytest.fixture(scope="module")
def accel(request):
    saved = {n: os.environ.pop(n) for n in [n for n in os.environ if n.startswith("FL_")]}
    if request.module.PROFILE:
        os.environ["FL_SIM_PROFILE"] = request.module.PROFILE
    ft.deactivate()
    selection = ft.init_backend(request.module.BACKEND)
    yield selection
    ft.deactivate()
    os.environ.pop("FL_SIM_PROFILE", None)
    os.environ.update(saved)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).cuda()


def _warm_up(step):
    """Run ``step`` three times on a side stream, as the documentation's examples do."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)


def test_whole_network_capture_of_a_training_step_trains_as_eager(accel):
    """The documentation's whole-network example: forward, backward and optimizer step captured
    once, replayed with new data copied into the static inputs."""
    model, eager = _model(), _model()
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    eager_optimizer = torch.optim.SGD(eager.parameters(), lr=0.1)
    static_input = torch.randn(8, 16, device="cuda")
    static_target = torch.randn(8, 4, device="cuda")

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(static_input), static_target)
        loss.backward()
        optimizer.step()

    _warm_up(step)
    for _ in range(3):  # the same three steps eagerly
        eager_optimizer.zero_grad(set_to_none=True)
        loss_fn(eager(static_input), static_target).backward()
        eager_optimizer.step()
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_fn(model(static_input), static_target)
        static_loss.backward()
        optimizer.step()
    for p, q in zip(model.parameters(), eager.parameters()):  # a capture changes nothing, as on CUDA
        assert torch.equal(p, q)
    torch.manual_seed(1)
    for _ in range(4):
        data, target = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
        static_input.copy_(data)
        static_target.copy_(target)
        graph.replay()
        eager_optimizer.zero_grad(set_to_none=True)
        expected = loss_fn(eager(data), target)
        expected.backward()
        eager_optimizer.step()
        assert torch.allclose(static_loss, expected, atol=1e-6)
    for p, q in zip(model.parameters(), eager.parameters()):
        assert torch.allclose(p, q, atol=1e-6)


def test_partial_capture_with_make_graphed_callables_trains_as_eager(accel):
    """The documentation's partial-network example: graphed modules with data-dependent control
    flow between them, forward and backward replayed."""
    torch.manual_seed(0)
    modules = [torch.nn.Linear(16, 32).cuda(), torch.nn.Linear(32, 4).cuda(), torch.nn.Linear(32, 4).cuda()]
    eager = copy.deepcopy(modules)
    x = torch.randn(8, 16, device="cuda")
    h = torch.randn(8, 32, device="cuda", requires_grad=True)
    graphed = [torch.cuda.make_graphed_callables(modules[0], (x,)),
               torch.cuda.make_graphed_callables(modules[1], (h,)),
               torch.cuda.make_graphed_callables(modules[2], (h,))]
    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1)
    eager_optimizer = torch.optim.SGD([p for m in eager for p in m.parameters()], lr=0.1)
    torch.manual_seed(1)
    for _ in range(4):
        data, target = torch.randn(8, 16, device="cuda"), torch.randn(8, 4, device="cuda")
        losses = []
        for mods, opt in ((graphed, optimizer), (eager, eager_optimizer)):
            opt.zero_grad(set_to_none=True)
            hidden = mods[0](data)
            out = mods[1](hidden) if hidden.sum().item() > 0 else mods[2](hidden)
            loss = torch.nn.functional.mse_loss(out, target)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], abs=1e-6)


def test_random_operators_draw_fresh_numbers_at_each_replay(accel):
    static = torch.zeros(64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    _warm_up(lambda: torch.nn.functional.dropout(static + 1, 0.5))
    with torch.cuda.graph(graph):
        noise = torch.randn(64, device="cuda")
        dropped = torch.nn.functional.dropout(static + 1, 0.5)
    draws = []
    for _ in range(3):
        graph.replay()
        draws.append((noise.clone(), dropped.clone()))
    assert not torch.equal(draws[0][0], draws[1][0]) and not torch.equal(draws[1][0], draws[2][0])
    assert not torch.equal(draws[0][1], draws[1][1])
    assert set(draws[2][1].unique().tolist()) <= {0.0, 2.0}


def test_a_capture_draws_no_number_the_program_would_see(accel):
    """As a CUDA capture, which reserves philox offsets for its replays and leaves the
    generator's: the numbers drawn after a capture are those drawn without it, and each replay
    draws the numbers eager code would draw at that point."""
    static = torch.zeros(64, device="cuda")
    graph = torch.cuda.CUDAGraph()
    torch.manual_seed(3)
    expected_after = torch.randn(64, device="cuda")
    expected_replay = torch.randn(64, device="cuda")
    torch.manual_seed(3)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        graph.capture_begin()
        noise = torch.randn(64, device="cuda") + static
        graph.capture_end()
    assert torch.equal(torch.randn(64, device="cuda"), expected_after)
    graph.replay()
    assert torch.equal(noise, expected_replay)


def test_static_outputs_follow_static_inputs_and_pools_are_shared(accel):
    a = torch.ones(4, device="cuda")
    first, second = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    assert isinstance(pool, tuple)
    with torch.cuda.graph(first, pool=pool):
        b = a * 2
    assert first.pool() == pool
    with torch.cuda.graph(second, pool=first.pool()):
        c = b + a
    a.copy_(torch.arange(4.0, device="cuda"))
    first.replay()
    second.replay()
    assert b.tolist() == [0.0, 2.0, 4.0, 6.0] and c.tolist() == [0.0, 3.0, 6.0, 9.0]
    first.reset()
    with pytest.raises(RuntimeError, match="replay without a preceding successful capture"):
        first.replay()
    with torch.cuda.graph(first):  # a reset graph captures again
        b.mul_(10)
    first.replay()
    assert b.tolist() == [0.0, 20.0, 40.0, 60.0]


def _device_pool_or_skip() -> None:
    if "allocation.all.current" not in torch.cuda.memory_stats():
        pytest.skip("the host keeps no device pool: its graphs keep the tensors they touched")


def test_graphs_sharing_a_pool_reuse_its_memory_which_eager_allocations_never_get(accel):
    """CUDA's private graph pools: what a capture frees stays the graph's (not handed to an
    eager allocation) and serves the next capture into the same pool; a graph with a pool of
    its own does not get it."""
    _device_pool_or_skip()
    x = torch.ones(1024, device="cuda")
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    first, second, alone = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    pool = torch.cuda.graph_pool_handle()
    with torch.cuda.graph(first, pool=pool):
        temporary = x * 2
        out_first = temporary + 1
        freed = temporary.data_ptr()
        del temporary
    assert torch.cuda.memory_reserved() > reserved  # the pool's segment counts, as CUDA's does
    eager = [torch.empty(1024, device="cuda") for _ in range(4)]
    assert freed not in {e.data_ptr() for e in eager}
    with torch.cuda.graph(alone):
        own = x * 4
    with torch.cuda.graph(second, pool=first.pool()):
        reused = x * 3
        out_second = reused - 1
    assert reused.data_ptr() == freed and own.data_ptr() != freed
    x.fill_(2)
    for graph in (first, second, alone):
        graph.replay()
    assert out_first.tolist() == [5.0] * 1024 and out_second.tolist() == [5.0] * 1024
    assert own.tolist() == [8.0] * 1024


def test_a_reset_graph_gives_its_pool_back(accel):
    """The graph's memory counts in ``memory_allocated``/``memory_stats`` while it lives; after
    ``reset()`` and the program's last reference, ``empty_cache`` returns the pool."""
    _device_pool_or_skip()
    x = torch.ones(256, 256, device="cuda")
    torch.cuda.empty_cache()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    segments = torch.cuda.memory_stats()["segment.all.current"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = (x @ x).relu()
    assert torch.cuda.memory_allocated() >= allocated + out.nbytes
    assert torch.cuda.memory_stats()["segment.all.current"] > segments
    del out
    torch.cuda.empty_cache()  # the pool is the graph's while it lives
    assert torch.cuda.memory_reserved() > reserved
    graph.reset()
    torch.cuda.empty_cache()
    assert torch.cuda.memory_allocated() == allocated and torch.cuda.memory_reserved() == reserved
    assert torch.cuda.memory_stats()["segment.all.current"] == segments


def test_capturing_is_reported_on_the_capturing_stream_only(accel):
    graph = torch.cuda.CUDAGraph()
    assert torch.cuda.is_current_stream_capturing() is False
    seen = []
    with torch.cuda.graph(graph):
        seen.append(torch.cuda.is_current_stream_capturing())
        with torch.cuda.stream(torch.cuda.default_stream()):
            seen.append(torch.cuda.is_current_stream_capturing())
    assert seen == [True, False] and torch.cuda.is_current_stream_capturing() is False


def test_a_capture_on_the_default_stream_is_refused_as_cuda_refuses_it(accel):
    with pytest.raises(RuntimeError, match="graphs must be captured on a non-default stream"):
        torch.cuda.CUDAGraph().capture_begin()
    with pytest.raises(RuntimeError, match="Unknown capture error mode.*relaxed.*'sloppy'"):
        with torch.cuda.graph(torch.cuda.CUDAGraph(), capture_error_mode="sloppy"):
            pass


@pytest.mark.parametrize("forbidden", ["item", "synchronize", "to_host"])
def test_what_a_device_forbids_during_capture_is_refused_with_its_message(accel, forbidden):
    x = torch.ones(3, device="cuda")
    if forbidden == "to_host" and x.device.type == "cpu":
        pytest.skip("the host's tensors are already on the host")
    use = {"item": lambda: x.sum().item(), "synchronize": torch.cuda.synchronize,
           "to_host": lambda: x.cpu()}[forbidden]
    with pytest.raises(RuntimeError, match=REFUSED):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            use()
    graph = torch.cuda.CUDAGraph()  # without the context manager: CUDA's second error at the end
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        graph.capture_begin()
        with pytest.raises(RuntimeError, match=REFUSED):
            use()
        with pytest.raises(RuntimeError, match="operation failed due to a previous error during capture"):
            graph.capture_end()
    torch.cuda.synchronize()  # no capture underway any more
    assert x.sum().item() == 3.0


@pytest.mark.parametrize("mode, refused", [("global", True), ("thread_local", False), ("relaxed", False)])
def test_capture_error_mode_decides_whether_other_threads_may_synchronize(accel, mode, refused):
    errors = []

    def other_thread():
        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:
            errors.append(str(exc))

    graph = torch.cuda.CUDAGraph()
    x = torch.ones(2, device="cuda")
    try:
        with torch.cuda.graph(graph, capture_error_mode=mode):
            y = x + 1
            worker = threading.Thread(target=other_thread)
            worker.start()
            worker.join()
    except RuntimeError:
        assert refused  # the global capture is invalidated, as CUDA invalidates it
    assert bool(errors) is refused and all(REFUSED in e for e in errors)
    if not refused:
        graph.replay()
        assert y.tolist() == [2.0, 2.0]


def test_reduce_overhead_compiles_and_runs_as_eager(accel):
    """Inductor skips graphs for the backend's tensors with its own reason, as plain torch does
    for the CPU's, and the compiled function gives eager's result."""
    from torch._dynamo.utils import counters

    model = _model()
    x = torch.randn(5, 16, device="cuda")
    expected = model(x)
    torch._dynamo.reset()
    skips = counters["inductor"]["cudagraph_skips"]
    compiled = torch.compile(model, mode="reduce-overhead")
    for _ in range(3):
        out = compiled(x)
    assert torch.allclose(out, expected, atol=1e-5)
    if importlib.util.find_spec("torch._inductor.cudagraph_utils") is not None:
        # (torch 2.1's Inductor has neither the module nor the counter: it skips without counting)
        assert counters["inductor"]["cudagraph_skips"] > skips
