"""The cases of ``torch.nn.DataParallel`` on the simulated accelerator: the batch scattered over
the chip's devices, the module replicated, applied in parallel and gathered on the output device,
as DataParallel does on CUDA, with the single-device result; and the device-comm primitives of
``torch.nn.parallel.comm`` on the chip's devices. The test modules that import them (plain sim
with two devices or one, a chip profile) run in fresh interpreters: PrivateUse1 is claimed once
per process. A module's ``PROFILE`` names the sim profile (None: the plain sim), ``DEVICES`` the
number of devices."""
from __future__ import annotations

import copy
import os
import sys

import pytest
import torch

import flagos_torchfl as ft


@pytest.fixture(scope="module")
def chip(request):
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ["FL_SIM_DEVICES"] = str(request.module.DEVICES)
    if request.module.PROFILE:
        os.environ["FL_SIM_PROFILE"] = request.module.PROFILE
    selection = ft.init_backend("sim")
    yield selection
    ft.deactivate()


@pytest.fixture
def two(chip):
    """The chip, where it has two devices (else the test is skipped)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two devices")
    return chip


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _train(model, wrap, batch, steps=2):
    """Forward, backward and an SGD step, ``steps`` times: the last output, the gradients of the
    last backward and the parameters after the last step, on the host."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    net = wrap(model)
    for _ in range(steps):
        optimizer.zero_grad()
        out = net(batch)
        out.pow(2).sum().backward()
        grads = [p.grad.detach().cpu() for p in model.parameters()]
        optimizer.step()
    return out.detach().cpu(), grads, [p.detach().cpu() for p in model.parameters()]


def _close(got, expected):
    return all(torch.allclose(g, e, atol=1e-6) for g, e in zip(got, expected, strict=True))


#: DataParallel's device_ids, and the number of devices they need
DEVICE_IDS = [(None, 1), ([0], 1), (["cuda:0"], 1), ([0, 1], 2), ([1, 0], 2), (["cuda:0", torch.device("cuda", 1)], 2)]


@pytest.mark.parametrize("device_ids,needs", DEVICE_IDS, ids=[str(d[0]) for d in DEVICE_IDS])
def test_training_gives_the_single_device_result(chip, device_ids, needs):
    if torch.cuda.device_count() < needs:
        pytest.skip("needs two devices")
    batch = torch.randn(6, 4)
    expected = _train(_model(), lambda m: m, batch)
    model = _model().to(device_ids[0] if device_ids else "cuda")
    got = _train(model, lambda m: torch.nn.DataParallel(m, device_ids=device_ids), batch.cuda())
    for g, e in zip(got, expected, strict=True):
        assert _close(g if isinstance(g, list) else [g], e if isinstance(e, list) else [e])


def test_the_batch_may_come_from_the_host(chip):
    batch = torch.randn(5, 4)
    out = torch.nn.DataParallel(_model().cuda())(batch)
    assert out.device == torch.device(chip.device_type, 0)
    assert torch.allclose(out.cpu(), _model()(batch), atol=1e-6)


class _Recorder(torch.nn.Module):
    """Notes the device of each replica's input and weight."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.seen = []

    def forward(self, x):
        self.seen.append((x.device, self.linear.weight.device, x.shape[0]))
        return self.linear(x)


def test_replicas_run_on_each_device_and_gather_on_the_output_device(two):
    chip = two
    own = chip.device_type
    model = _Recorder().cuda()
    out = torch.nn.DataParallel(model)(torch.randn(6, 4, device="cuda"))
    assert sorted(model.seen, key=str) == [(torch.device(own, 0),) * 2 + (3,), (torch.device(own, 1),) * 2 + (3,)]
    assert out.device == torch.device(own, 0) and out.shape == (6, 2)
    assert torch.nn.DataParallel(model, output_device=1)(torch.randn(6, 4)).device == torch.device(own, 1)
    assert torch.nn.DataParallel(model, output_device="cuda:1")(torch.randn(6, 4)).device == torch.device(own, 1)
    with pytest.warns(FutureWarning, match="Using -1 to represent CPU"):
        assert torch.nn.DataParallel(model, output_device=-1)(torch.randn(6, 4)).device.type == "cpu"
    dp = torch.nn.DataParallel(model, device_ids=["cuda:1", 0])
    assert dp.device_ids == [1, 0] and dp.src_device_obj == torch.device(own, 1)
    with pytest.raises(RuntimeError, match=f"on device {own}:1 \\(device_ids\\[0\\]\\)"):
        dp(torch.randn(6, 4))


def test_batchnorm_is_what_data_parallel_computes_on_cuda(two):
    chip = two
    torch.manual_seed(1)
    host = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    model = copy.deepcopy(host).cuda()
    batch = torch.randn(8, 4)
    out = torch.nn.DataParallel(model)(batch.cuda())
    # each replica normalizes its half with its own statistics; the replica on device_ids[0]
    # shares the module's buffers, so the running statistics are those of the first half
    halves = [copy.deepcopy(host)(half) for half in batch.chunk(2)]
    first = copy.deepcopy(host)
    first(batch.chunk(2)[0])
    assert torch.allclose(out.cpu(), torch.cat(halves), atol=1e-5)
    assert torch.allclose(model[1].running_mean.cpu(), first[1].running_mean, atol=1e-6)
    assert torch.allclose(model[1].running_var.cpu(), first[1].running_var, atol=1e-6)
    assert int(model[1].num_batches_tracked) == 1
    model.eval(), first.eval()  # the running statistics: the single-device result
    assert torch.allclose(torch.nn.DataParallel(model)(batch.cuda()).cpu(), first(batch), atol=1e-5)


class Structured(torch.nn.Module):
    """A module returning a dict holding a tuple; ``per_row``: its sum is one per row (so that
    replicas' parts gather along the batch), else one scalar."""

    def __init__(self, per_row=True):
        super().__init__()
        self.linear = torch.nn.Linear(4, 2)
        self.per_row = per_row

    def forward(self, x, scale=1.0):
        y = self.linear(x) * scale
        return {"out": y, "pair": (y.sum(1) if self.per_row else y.sum(), x)}


def test_dict_and_tuple_outputs_are_gathered(chip):
    torch.manual_seed(2)
    host = Structured()
    model = copy.deepcopy(host).cuda()
    batch = torch.randn(6, 4)
    got = torch.nn.DataParallel(model)(batch.cuda(), scale=2.0)
    expected = host(batch, scale=2.0)
    assert set(got) == {"out", "pair"} and isinstance(got["pair"], tuple)
    assert torch.allclose(got["out"].cpu(), expected["out"], atol=1e-6)
    assert torch.allclose(got["pair"][0].cpu(), expected["pair"][0], atol=1e-6)
    assert torch.equal(got["pair"][1].cpu(), batch)
    functional = torch.nn.parallel.data_parallel(model, batch.cuda(), module_kwargs={"scale": 2.0})
    assert torch.allclose(functional["out"].cpu(), expected["out"], atol=1e-6)


# ---------------------------------------------------------------- the primitives


def _on(chip, index):
    return torch.device(chip.device_type, index)


def test_broadcasts_copy_to_each_device(two):
    chip = two
    from torch.nn.parallel import comm

    x = torch.arange(6.0, device="cuda:0").view(2, 3)
    copies = comm.broadcast(x, [0, 1])
    assert copies[0] is x and copies[1].device == _on(chip, 1) and torch.equal(copies[1].cpu(), x.cpu())
    out = [torch.empty(2, 3, device="cuda:0"), torch.empty(2, 3, device="cuda:1")]
    assert all(torch.equal(o.cpu(), x.cpu()) for o in comm.broadcast(x, out=out))
    with pytest.raises(RuntimeError, match="must appear as the first on devices list"):
        comm.broadcast(x, [1, 0])
    with pytest.raises(RuntimeError, match="Exactly one of 'devices' and 'out'"):
        comm.broadcast(x)
    weight = torch.randn(3, requires_grad=True, device="cuda:0")
    tensors = [weight, torch.ones(2, 2, device="cuda:0", dtype=torch.int64)]
    first, second = comm.broadcast_coalesced(tensors, ["cuda:0", "cuda:1"])
    assert first[0] is weight and first[1] is tensors[1]
    assert [t.device for t in second] == [_on(chip, 1)] * 2 and not second[0].requires_grad
    assert torch.equal(second[0].cpu(), weight.detach().cpu()) and second[1].dtype == torch.int64
    with pytest.raises(RuntimeError, match="All tensors must be on devices\\[0\\]: 1"):
        comm.broadcast_coalesced(tensors, [1, 0])


def test_reductions_sum_onto_the_destination(two):
    chip = two
    from torch.nn.parallel import comm

    a, b = torch.ones(3, device="cuda:0"), torch.full((3,), 2.0, device="cuda:1")
    total = comm.reduce_add([a, b], destination=1)
    assert total.device == _on(chip, 1) and total.tolist() == [3.0] * 3
    assert comm.reduce_add([a, b]).device == _on(chip, 0)  # the current device
    with pytest.raises(RuntimeError, match="destination to be on the same GPU"):
        comm.reduce_add([a, a], destination=1)
    with pytest.raises(ValueError, match="input 1 has invalid size"):
        comm.reduce_add([a, torch.ones(2, device="cuda:1")], destination=0)
    sums = comm.reduce_add_coalesced([[a, a * 2], [b, b * 2]], destination=0)
    assert [s.tolist() for s in sums] == [[3.0] * 3, [6.0] * 3]


def test_scatter_and_gather_split_and_join_along_a_dimension(two):
    chip = two
    from torch.nn.parallel import comm

    x = torch.arange(12.0).view(6, 2)
    parts = comm.scatter(x, [0, 1], chunk_sizes=[2, 4])
    assert [p.device for p in parts] == [_on(chip, 0), _on(chip, 1)] and [p.shape[0] for p in parts] == [2, 4]
    on_chip = x.cuda()
    assert comm.scatter(on_chip, [0, 1])[0].data_ptr() == on_chip.data_ptr()  # stays a view
    with pytest.raises(RuntimeError, match="Expected devices and chunk_sizes to be of same length"):
        comm.scatter(x, [0, 1], chunk_sizes=[6])
    out = [torch.empty(1, 2, device="cuda:0"), torch.empty(5, 2, device="cuda:1")]
    assert torch.equal(torch.cat([o.cpu() for o in comm.scatter(x, out=out)]), x)
    joined = comm.gather(parts, dim=0, destination=1)
    assert joined.device == _on(chip, 1) and torch.equal(joined.cpu(), x)
    assert comm.gather(parts, destination="cpu").device.type == "cpu"
    target = torch.empty(6, 2, device="cuda:0")
    assert comm.gather(parts, out=target) is target and torch.equal(target.cpu(), x)
    with pytest.raises(RuntimeError, match="Input tensor at index 1 has invalid shape"):
        comm.gather([parts[0], torch.ones(2, 3, device="cuda:1")])
    with pytest.raises(RuntimeError, match=f"to be {chip.device_type} tensors"):
        comm.gather([parts[0], torch.ones(2, 2)])


def test_deactivation_gives_torch_its_primitives_back(chip):
    import torch.cuda.comm as cuda_comm
    from torch.nn.parallel import comm

    names = ("broadcast", "broadcast_coalesced", "reduce_add", "scatter", "gather")
    patched = {name: getattr(comm, name) for name in names}
    assert all(getattr(cuda_comm, name) is patched[name] for name in names)
    forward, init = torch.nn.DataParallel.forward, torch.nn.DataParallel.__init__
    ft.deactivate()
    try:
        assert all(getattr(comm, name) is not patched[name] for name in names)
        assert all(getattr(cuda_comm, name) is getattr(comm, name) for name in names)
        assert not any(hasattr(getattr(comm, name), "__wrapped__") for name in names)
        assert torch.nn.DataParallel.__init__ is not init and not hasattr(torch.nn.DataParallel.__init__, "__wrapped__")
        functional = torch.nn.parallel.data_parallel
        assert functional is sys.modules["torch.nn.parallel.data_parallel"].data_parallel
        assert not hasattr(functional, "__wrapped__")
        assert torch.nn.DataParallel.forward is forward  # patched only where all devices are the host
    finally:
        ft.init_backend("sim")
