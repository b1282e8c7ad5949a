"""Mixed precision on the sim (PrivateUse1): CUDA's autocast rules make
``torch.autocast("sim", torch.bfloat16)`` cast as on CUDA; per-operator precision,
``enable_mixed_precision``, the finite guard and precision_check work on the device."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]

KEY = "AutocastPrivateUse1"


@pytest.fixture(scope="module", autouse=True)
def sim():
    from tests.routing.simutil import start_sim
    start_sim()


@pytest.fixture
def rules():
    from flagos_torchfl.precision import register_autocast_rules
    reg = register_autocast_rules("sim")
    yield reg
    reg()


def bf16():
    return torch.autocast("sim", torch.bfloat16)


def test_without_rules_autocast_casts_nothing_and_capability_says_so():
    from flagos_torchfl.precision import amp_supported_dtypes, is_bf16_supported
    lin = torch.nn.Linear(4, 3).to("sim")
    with bf16():
        assert lin(torch.randn(2, 4, device="sim")).dtype == torch.float32
    assert amp_supported_dtypes(KEY, [torch.float16, torch.bfloat16]) == []
    assert not is_bf16_supported(KEY, [torch.float16, torch.bfloat16])


def test_rules_cast_as_cuda_lists_say(rules):
    from flagos_torchfl.precision import amp_supported_dtypes, is_bf16_supported
    assert rules.kept == () and len(rules.registered) == 119 and rules.dispatch_key == KEY
    assert amp_supported_dtypes(KEY, [torch.float16, torch.bfloat16]) == [torch.float16, torch.bfloat16]
    assert is_bf16_supported(KEY, [torch.bfloat16])
    lin = torch.nn.Linear(4, 3).to("sim")
    x = torch.randn(2, 4, device="sim")
    with bf16():
        h = lin(x)
        assert h.dtype == torch.bfloat16
        assert torch.softmax(h, -1).dtype == torch.float32
        assert torch.log_softmax(h, -1).dtype == torch.float32
        assert torch.nn.functional.layer_norm(h, (3,)).dtype == torch.float32
        assert torch.addcmul(h, h, x[:, :3]).dtype == torch.float32   # promote
        assert torch.addcmul(h, h, h).dtype == torch.bfloat16
        assert torch.stack([h, x[:, :3]]).dtype == torch.float32      # PyTorch's own promotion
        assert torch.cat([h, x[:, :3]]).dtype == torch.float32
        cpu_lin = torch.nn.Linear(4, 3)
        assert cpu_lin(torch.randn(2, 4)).dtype == torch.float32      # CPU tensors untouched
    assert lin(x).dtype == torch.float32                              # outside autocast


def test_results_equal_cpu_autocast_where_lists_agree(rules):
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 5)
    x, target = torch.randn(4, 8, requires_grad=True), torch.randn(4, 5)
    sim_lin = torch.nn.Linear(8, 5).to("sim")
    sim_lin.load_state_dict(lin.state_dict())
    xs = x.detach().to("sim").requires_grad_()
    with torch.autocast("cpu", torch.bfloat16):
        out = lin(x)
        loss = torch.nn.functional.mse_loss(out, target)  # fp32 in both lists
    with bf16():
        out_s = sim_lin(xs)
        loss_s = torch.nn.functional.mse_loss(out_s, target.to("sim"))
    assert out_s.dtype == out.dtype == torch.bfloat16 and loss_s.dtype == loss.dtype == torch.float32
    assert torch.equal(out_s.cpu(), out) and torch.equal(loss_s.cpu(), loss)
    loss.backward()
    loss_s.backward()
    assert torch.equal(xs.grad.cpu(), x.grad)
    assert torch.equal(sim_lin.weight.grad.cpu(), lin.weight.grad)


def test_undo_removes_every_kernel():
    from flagos_torchfl.precision import listed_ops, register_autocast_rules
    reg = register_autocast_rules("sim")
    assert all(torch._C._dispatch_has_kernel_for_dispatch_key(op, KEY) for op in listed_ops())
    reg()
    assert not any(torch._C._dispatch_has_kernel_for_dispatch_key(op, KEY) for op in listed_ops())
    with bf16():
        assert torch.nn.Linear(4, 3).to("sim")(torch.randn(2, 4, device="sim")).dtype == torch.float32


def test_op_precision_on_sim(rules):
    from flagos_torchfl.precision import set_op_precision
    from tests.precision.dtypes import InputDtypes
    lin = torch.nn.Linear(8, 8).to("sim")
    x = torch.randn(4, 8, device="sim")

    def gelu_inputs():
        with bf16(), InputDtypes() as seen:
            torch.nn.functional.gelu(lin(x))
        return seen.seen["aten::gelu"]

    assert gelu_inputs() == [(torch.bfloat16,)]
    undo = set_op_precision("gelu", torch.float32, "sim")
    assert gelu_inputs() == [(torch.float32,)]
    undo_linear = set_op_precision("linear", torch.float32, "sim")  # over CUDA's rule
    with bf16():
        assert lin(x).dtype == torch.float32
    undo_linear()
    undo()
    assert gelu_inputs() == [(torch.bfloat16,)]
    with bf16():
        assert lin(x).dtype == torch.bfloat16  # CUDA's rule is back
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::linear", KEY)
    assert not torch._C._dispatch_has_kernel_for_dispatch_key("aten::gelu", KEY)


def test_enable_mixed_precision_matches_hand_written_twin(rules):
    from flagos_torchfl.precision import enable_mixed_precision
    from tests.precision.test_auto_mixed import train
    twin = train("sim", True)
    undo = enable_mixed_precision("sim", torch.bfloat16)
    try:
        auto = train("sim", False)
    finally:
        undo()
    assert twin[1] == torch.bfloat16 and auto == twin
    assert train("sim", False)[1] == torch.float32


def test_finite_guard_on_sim():
    from flagos_torchfl.precision import NonFiniteError, check_finite
    undo = check_finite(True, lambda op: "composite" if op == "aten::exp" else "native")
    try:
        with pytest.raises(NonFiniteError, match=r"aten::exp \(route: composite\).*sim"):
            torch.full((3,), 20.0, device="sim", dtype=torch.float16).exp()
    finally:
        undo()


def test_precision_check_on_sim(rules):
    transformers = pytest.importorskip("transformers")
    from flagos_torchfl.precision import precision_check
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=64)
    model = transformers.BertModel(config).to("sim")
    ids = torch.randint(0, 100, (2, 8)).to("sim")
    fp32 = precision_check(model, {"input_ids": ids})
    mixed = precision_check(model, {"input_ids": ids}, autocast_dtype=torch.bfloat16)
    assert fp32[0].rel_error < 1e-5 < mixed[0].rel_error < 5e-2
    query = next(r for r in mixed if r.module == "encoder.layer.0.attention.self.query")
    assert query.dtype == "bfloat16"
