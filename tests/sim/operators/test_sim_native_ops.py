"""Native kernels of the installed sim: semantics of in-place, out=, views, copies, autograd,
printing, serialization, and what happens outside the native set."""
from __future__ import annotations

import ctypes
import io
import pickle

import pytest
import torch

import flagos_torchfl.sim as fsim

pytestmark = pytest.mark.isolated


@pytest.fixture(scope="module")
def sim():
    return fsim.install(num_devices=1)


def test_device_memory_is_separate_and_copies_are_real(sim):
    src = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    dev = src.to("sim")
    assert dev.device == torch.device("sim:0")
    assert dev.data_ptr() != src.data_ptr()
    src.zero_()  # the device copy does not follow the host tensor
    assert dev.cpu().tolist() == [[0, 1, 2], [3, 4, 5]]
    back = dev.cpu()
    back.fill_(9)
    assert dev.cpu().tolist() == [[0, 1, 2], [3, 4, 5]]


def test_data_pointer_is_real_host_memory(sim):
    dev = torch.tensor([1.5, -2.0, 3.25], device="sim")
    raw = (ctypes.c_float * 3).from_address(dev.data_ptr())
    assert list(raw) == [1.5, -2.0, 3.25]
    assert dev.untyped_storage().data_ptr() == dev.data_ptr()


def test_host_view_aliases_with_same_geometry(sim):
    dev = torch.arange(12.0, device="sim").reshape(3, 4).t()[1:]
    view = fsim.host_view(dev)
    assert view.device.type == "cpu"
    assert (view.size(), view.stride(), view.storage_offset()) == \
        (dev.size(), dev.stride(), dev.storage_offset())
    view.fill_(-1)
    assert (dev.cpu() == -1).all()
    with pytest.raises(TypeError):
        fsim.host_view(torch.ones(2))


def test_arithmetic_matmul_and_reductions_match_cpu(sim):
    torch.manual_seed(0)
    a, b = torch.randn(5, 4), torch.randn(4, 3)
    da, db = a.to("sim"), b.to("sim")
    torch.testing.assert_close(((da * 2 + 1) @ db).cpu(), (a * 2 + 1) @ b)
    torch.testing.assert_close(torch.bmm(da[None], db[None]).cpu(), torch.bmm(a[None], b[None]))
    torch.testing.assert_close(da.sum(1).cpu(), a.sum(1))
    torch.testing.assert_close(da.amax().cpu(), a.amax())
    assert da.argmax().item() == a.argmax().item()
    assert torch.equal(da.half().float().cpu(), a.half().float())


def test_in_place_and_out_return_the_given_tensors(sim):
    x = torch.ones(3, device="sim")
    assert x.add_(2) is x and x.cpu().tolist() == [3, 3, 3]
    assert x.mul_(torch.full((3,), 2.0, device="sim")) is x
    out = torch.empty(0, device="sim")
    res = torch.add(x, 1, out=out)
    assert res is out and out.shape == (3,) and out.cpu().tolist() == [7, 7, 7]
    small = torch.empty(5, device="sim")
    torch.mul(x, 2, out=small[:3])  # writes through a view of a bigger tensor
    assert small[:3].cpu().tolist() == [12, 12, 12]
    values, indices = torch.empty(0, device="sim"), torch.empty(0, dtype=torch.long, device="sim")
    r = torch.max(torch.tensor([[1.0, 5.0], [7.0, 2.0]], device="sim"), 1, out=(values, indices))
    assert r[0] is values and r[1] is indices
    assert values.cpu().tolist() == [5, 7] and indices.cpu().tolist() == [1, 0]


def test_views_share_storage(sim):
    base = torch.zeros(4, 4, device="sim")
    for view in (base[1], base[:, 2], base.view(16), base.t(), base.as_strided((2,), (5,)),
                 base.unsqueeze(0), base.expand(2, 4, 4), base.permute(1, 0)):
        assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    base[1].fill_(1)
    base.view(16)[0] = 5
    assert base.cpu()[1].tolist() == [1, 1, 1, 1] and base.cpu()[0, 0] == 5
    col = base.t()[2]
    col.add_(10)
    assert base.cpu()[:, 2].tolist() == [10, 11, 10, 10]
    u = torch.zeros(3, device="sim")
    assert u.unsqueeze_(0) is u and u.shape == (1, 3)


def test_set_and_copy_between_devices(sim):
    a = torch.arange(6.0, device="sim")
    b = torch.empty(0, device="sim")
    b.set_(a.untyped_storage(), 2, (2, 2), (2, 1))
    assert b.cpu().tolist() == [[2, 3], [4, 5]]
    c = torch.empty(3, device="sim")
    c.copy_(torch.tensor([1, 2, 3]))  # host -> device, with a dtype change
    host = torch.empty(3, dtype=torch.float64)
    host.copy_(c)  # device -> host
    assert host.tolist() == [1, 2, 3]
    with pytest.raises(RuntimeError, match="different device"):
        b.set_(torch.UntypedStorage(8))


def test_scalars_lists_and_numpy(sim):
    t = torch.tensor([[1, 2], [3, 4]], device="sim")
    assert t[1, 0].item() == 3
    assert t.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(TypeError, match="cpu"):
        t.numpy()


def test_printing(sim):
    text = str(torch.tensor([1.5, 2.0], device="sim"))
    assert "1.5000" in text and "device='sim:0'" in text
    assert "..." in str(torch.arange(5000.0, device="sim"))
    assert "grad_fn" in repr(torch.ones(2, device="sim", requires_grad=True) * 2)
    assert "j" in str(torch.ones(2, dtype=torch.complex64, device="sim"))


def test_linear_forward_backward_equals_cpu(sim):
    torch.manual_seed(0)
    ref = torch.nn.Linear(8, 4)
    dev = torch.nn.Linear(8, 4).to("sim")
    dev.load_state_dict(ref.state_dict())
    x = torch.randn(16, 8)
    (ref(x) ** 2).sum().backward()
    out = dev(x.to("sim"))
    (out ** 2).sum().backward()
    assert isinstance(dev.weight, torch.nn.Parameter) and dev.weight.grad.device.type == "sim"
    torch.testing.assert_close(out.cpu(), ref(x))
    torch.testing.assert_close(dev.weight.grad.cpu(), ref.weight.grad)
    torch.testing.assert_close(dev.bias.grad.cpu(), ref.bias.grad)


def test_conv_and_layer_norm_backward_equal_cpu(sim):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.Flatten(), torch.nn.LayerNorm(12))
    dev = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.Flatten(),
                              torch.nn.LayerNorm(12)).to("sim")
    dev.load_state_dict(ref.state_dict())
    x = torch.randn(2, 2, 4, 4)
    ref(x).sum().backward()
    dev(x.to("sim")).sum().backward()
    for p_ref, p_dev in zip(ref.parameters(), dev.parameters()):
        torch.testing.assert_close(p_dev.grad.cpu(), p_ref.grad, rtol=1e-5, atol=1e-5)


def test_save_and_load(sim):
    t = torch.arange(6.0, device="sim").reshape(2, 3)
    buf = io.BytesIO()
    torch.save({"t": t, "row": t[1]}, buf)
    for location, device in ((None, "sim:0"), ("cpu", "cpu"), ("sim", "sim:0")):
        buf.seek(0)
        loaded = torch.load(buf, map_location=location)
        assert loaded["t"].device == torch.device(device)
        assert loaded["t"].cpu().tolist() == [[0, 1, 2], [3, 4, 5]]
        row, whole = loaded["row"].untyped_storage(), loaded["t"].untyped_storage()
        assert row.data_ptr() == whole.data_ptr()  # still one storage
    host = io.BytesIO()
    torch.save(torch.ones(3), host)
    host.seek(0)
    assert torch.load(host, map_location="sim").device.type == "sim"


def test_pickle_storage_slices_and_record_stream(sim):
    t = torch.arange(6.0, device="sim")
    again = pickle.loads(pickle.dumps(t))
    assert again.device == t.device and again.cpu().tolist() == t.cpu().tolist()
    piece = t.untyped_storage()[4:12]  # PyTorch's own view of sim memory
    assert piece.device == t.device and piece.data_ptr() == t.data_ptr() + 4
    assert torch.empty(0, device="sim").set_(piece).cpu().tolist() == [1.0, 2.0]
    with pytest.raises(RuntimeError, match="view of another storage"):
        piece.resize_(100)
    t.record_stream(torch.accelerator.current_stream())  # a no-op: work runs inline


def test_parameter_subclass_and_detach(sim):
    t = torch.ones(2, device="sim")
    p = torch.nn.Parameter(t)
    assert p.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()

    class Sub(torch.Tensor):
        pass

    assert type(t.as_subclass(Sub)) is Sub
    assert t.detach().untyped_storage().data_ptr() == t.data_ptr()


def test_operator_outside_the_native_set_raises_not_crashes(sim):
    assert "aten::cumprod" not in fsim.native_op_names()
    with pytest.raises(NotImplementedError, match="cumprod"):
        torch.ones(3, device="sim").cumprod(0)


@pytest.mark.parametrize("name", [
    "add", "mul", "div", "pow", "exp", "sum", "mean", "amax", "cat", "index_select", "gather",
    "scatter", "where", "clamp", "softmax", "log_softmax", "nn.functional.layer_norm",
    "nn.functional.conv2d", "nn.functional.embedding", "mm", "addmm", "sort", "topk", "cumsum",
    "flip", "constant_pad_nd", "nn.functional.avg_pool2d",
    "index_put", "sigmoid", "nn.functional.gelu",
])
def test_opinfo_samples_match_cpu(sim, name):
    from torch.testing._internal.common_methods_invocations import op_db

    def move(x):
        return torch.utils._pytree.tree_map(
            lambda a: a.to("sim") if isinstance(a, torch.Tensor) else a, x)

    infos = [op for op in op_db if op.name == name]
    assert infos, name
    checked = 0
    for info in infos:
        for sample in list(info.sample_inputs("cpu", torch.float32))[:4]:
            args, kwargs = (sample.input, *sample.args), dict(sample.kwargs)
            expected = info.op(*args, **kwargs)
            dargs, dkwargs = move((args, kwargs))
            got = info.op(*dargs, **dkwargs)
            got = torch.utils._pytree.tree_map(
                lambda a: a.cpu() if isinstance(a, torch.Tensor) else a, got)
            torch.testing.assert_close(got, expected, equal_nan=True)
            checked += 1
    assert checked


def test_tiny_bert_moves_to_sim(sim):
    import transformers

    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, vocab_size=500,
                                     max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.BertModel(config)
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    model.to("sim")
    for key, value in model.state_dict().items():
        assert value.device.type == "sim", key
        assert torch.equal(value.cpu(), reference[key]), key
    ids = torch.randint(0, 500, (2, 8), device="sim")
    with pytest.raises(NotImplementedError, match="sim"):
        model(ids)  # needs operators outside the Core ATen set: the routing layer's job
