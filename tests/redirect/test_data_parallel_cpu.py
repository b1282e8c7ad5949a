"""``torch.nn.DataParallel`` on the cpu backend, where every logical device is the host: the
module runs itself on the whole batch, as DataParallel does with one device, and gives the
single-device result (forward values, gradients, parameters after a step, BatchNorm statistics);
torch's bookkeeping (``device_ids``, ``output_device``) stays as on CUDA."""
from __future__ import annotations

import copy

import pytest
import torch

import flagos_torchfl as ft
from tests.redirect.data_parallel_cases import Structured


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 3))


def _train(model, wrap, batch, steps=2):
    """The last output, gradients and parameters after ``steps`` SGD steps, and the running mean."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    net = wrap(model)
    for _ in range(steps):
        optimizer.zero_grad()
        out = net(batch)
        out.pow(2).sum().backward()
        optimizer.step()
    return [out.detach(), model[1].running_mean.clone()] + [p.grad for p in model.parameters()] + [
        p.detach() for p in model.parameters()]


WRAPS = {
    "all devices": lambda m: torch.nn.DataParallel(m),
    "device_ids=[0, 1]": lambda m: torch.nn.DataParallel(m, device_ids=[0, 1]),
    "device_ids=[1]": lambda m: torch.nn.DataParallel(m, device_ids=[1]),
    "cuda names, output_device=1": lambda m: torch.nn.DataParallel(
        m, device_ids=["cuda:0", torch.device("cuda", 1)], output_device=1),
}


@pytest.mark.parametrize("label", list(WRAPS))
def test_training_gives_the_single_device_result(two_cpu_devices, label):
    batch = torch.randn(6, 4)
    expected = _train(_model(), lambda m: m, batch)
    got = _train(_model().cuda(), WRAPS[label], batch.cuda())
    assert all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))


def test_data_parallel_keeps_torchs_bookkeeping(two_cpu_devices):
    model = _model().cuda()
    dp = torch.nn.DataParallel(model, device_ids=[0, 1], output_device=1)
    assert dp.module is model and dp.device_ids == [0, 1] and dp.output_device == 1
    assert torch.nn.DataParallel(model).device_ids == list(range(torch.cuda.device_count())) == [0, 1]




def test_structured_outputs_and_the_functional_form(two_cpu_devices):
    torch.manual_seed(1)
    model = Structured(per_row=False).cuda()
    batch = torch.randn(6, 4, device="cuda")
    expected = model(batch, scale=2.0)
    got = torch.nn.DataParallel(model)(batch, scale=2.0)
    assert torch.equal(got["out"], expected["out"]) and got["pair"][0].dim() == 0  # no vector of scalars
    assert got["pair"][1] is batch
    functional = torch.nn.parallel.data_parallel(model, batch, device_ids=[0, 1], module_kwargs={"scale": 2.0})
    assert torch.equal(functional["out"], expected["out"])
    assert torch.equal(torch.nn.parallel.data_parallel(model.linear, batch), model.linear(batch))


def test_deactivation_restores_data_parallel(two_cpu_devices):
    from torch.nn.parallel import comm

    patched = torch.nn.DataParallel.forward
    assert hasattr(patched, "__wrapped__") and not hasattr(comm.scatter, "__wrapped__")  # host: no comm patch
    ft.deactivate()
    assert torch.nn.DataParallel.forward is patched.__wrapped__
    assert not hasattr(torch.nn.parallel.data_parallel, "__wrapped__")
    if torch._utils._get_available_device_type() is None:  # plain torch without an accelerator
        plain = torch.nn.DataParallel(_model())
        assert plain.device_ids == [] and plain(torch.randn(3, 4)).shape == (3, 3)
