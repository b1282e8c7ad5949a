"""What a sim kernel promises (``flagos_torchfl.sim.operators.kernels``' docstring), checked the
same way on both runtimes: the C++ route's C++ kernel (test_cpp_route.py) and the Python kernels
(test_python_route.py). Each module's ``sim`` fixture installs its runtime
(:func:`installed_sim`); the tests here compare with the same operation on CPU tensors."""
from __future__ import annotations

import copy as copy_module

import pytest
import torch

import flagos_torchfl.sim as fsim
from flagos_torchfl.sim.operators.native_ops import device_kernel_ops


def installed_sim(runtime: str):
    """The sim on ``runtime`` with two devices and the CUDA-like native set ``device_kernel_ops``."""
    module = fsim.install(num_devices=2, native_ops=device_kernel_ops(), runtime=runtime)
    assert fsim.runtime_kind() == runtime
    return module


def test_in_place_returns_the_tensor_given_and_changes_it(sim):
    t = torch.arange(4.0, device="sim")
    assert t.add_(1) is t
    assert t.cpu().tolist() == [1.0, 2.0, 3.0, 4.0]
    assert t.unsqueeze_(0) is t and t.shape == (1, 4)


def test_out_returns_the_out_tensor_grown_when_too_small(sim):
    a = torch.arange(6.0, device="sim").view(2, 3)
    out = torch.empty(0, device="sim")
    got = torch.mul(a, 2, out=out)
    assert got is out and out.shape == (2, 3)
    assert torch.equal(out.cpu(), torch.arange(6.0).view(2, 3) * 2)
    values, indices = torch.empty(0, device="sim"), torch.empty(0, dtype=torch.long, device="sim")
    got = torch.sort(torch.tensor([3.0, 1.0, 2.0], device="sim"), out=(values, indices))
    assert got[0] is values and got[1] is indices and indices.cpu().tolist() == [1, 2, 0]


def test_views_share_the_storage_of_their_base(sim):
    base = torch.zeros(4, 4, device="sim")
    row = base[1]
    row.fill_(3)
    assert base.cpu()[1].tolist() == [3.0] * 4
    flat = base.view(16)
    assert flat.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    t = torch.ones(2, 3, device="sim").t()
    assert not t.is_contiguous() and t.contiguous().is_contiguous()


def test_fresh_outputs_are_sim_tensors_counted_by_the_allocator(sim):
    before = sim.memory_allocated(0)
    x = torch.ones(1000, device="sim") + 1
    assert x.device == torch.device("sim:0")
    assert sim.memory_allocated(0) >= before + 4000
    values, indices = x.view(10, 100).max(dim=1)
    assert values.device.type == indices.device.type == "sim"
    del x, values, indices
    assert sim.memory_allocated(0) == before


def test_device_arguments_choose_the_device_of_the_outputs(sim):
    t = torch.zeros(3, device="sim:1")
    assert t.device == torch.device("sim:1") and (t + 1).device == torch.device("sim:1")
    moved = torch.arange(3, device="sim:0").to("sim:1")
    assert moved.device == torch.device("sim:1") and moved.cpu().tolist() == [0, 1, 2]
    back = moved.to("cpu")
    assert back.device.type == "cpu" and back.tolist() == [0, 1, 2]


def test_mixed_devices_are_refused(sim):
    with pytest.raises(RuntimeError, match="sim:0 and sim:1"):
        torch.ones(2, device="sim:0") + torch.ones(2, device="sim:1")
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(2, device="sim") + torch.ones(2)
    assert (torch.ones(2, device="sim") + torch.tensor(1.0)).cpu().tolist() == [2.0, 2.0]
    index = torch.tensor([1, 0])
    assert torch.arange(3, device="sim")[index].cpu().tolist() == [1, 0]


def test_random_operators_draw_from_the_device_generator(sim):
    sim.manual_seed(7)
    a = torch.randn(5, device="sim")
    sim.manual_seed(7)
    b = torch.randn(5, device="sim")
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(a.cpu(), torch.randn(5, device="sim").cpu())


def test_conjugate_views_keep_their_bit(sim):
    z = torch.tensor([1 + 2j, 3 - 1j], device="sim")
    c = z.conj()
    assert c.is_conj()
    assert torch.equal((c * 1).cpu(), torch.tensor([1 - 2j, 3 + 1j]))


def test_training_step_equals_the_cpu_step(sim):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    copy = copy_module.deepcopy(model).to("sim")
    x = torch.randn(5, 8)
    for m, data in ((model, x), (copy, x.to("sim"))):
        m(data).square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), copy.parameters()):
        assert torch.allclose(p.grad, q.grad.cpu(), atol=1e-6), name


def test_a_zero_dim_cpu_out_is_refused_as_a_device_refuses_it(sim):
    t = torch.tensor([0.0, 1.0, 2.0], device="sim")
    with pytest.raises(RuntimeError, match="device"):
        torch.nonzero(t, out=torch.empty([], dtype=torch.long))


def test_a_view_in_inference_mode_of_a_tensor_made_outside_it(sim):
    """Ultralytics' validation indexes a model's buffer under ``torch.inference_mode()``: the view
    is a normal tensor sharing its base's version counter, as on the CPU."""
    base = torch.tensor([8.0, 16.0, 32.0], device="sim")
    with torch.inference_mode():
        view = base[1]
        made = torch.ones(2, device="sim")
    assert view.item() == 16.0 and not view.is_inference() and view._version == base._version
    assert made[0].is_inference() == made.is_inference()


def test_a_sparse_result_of_a_dense_operator_lands_on_the_device(sim):
    """``to_sparse`` of a device tensor: the dense kernel's sparse result is a sparse tensor of the
    device (its copy served by the device's sparse kernels), as on CUDA."""
    dense = torch.tensor([[0.0, 2.0], [3.0, 0.0]])
    got = dense.to("sim").to_sparse()
    assert got.device == torch.device("sim", 0) and got.layout == torch.sparse_coo
    assert torch.equal(got.to_dense().cpu(), dense)
    assert torch.equal(got.coalesce().indices().cpu(), dense.to_sparse().indices())
