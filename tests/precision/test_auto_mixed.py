"""``enable_mixed_precision`` on the CPU: a script without autocast gives the losses of its twin
that wraps the forward in ``torch.autocast`` by hand; the user's own autocast wins; float16
warns; undo removes the hooks."""
from __future__ import annotations

import warnings

import pytest
import torch

from flagos_torchfl import compat

from flagos_torchfl.precision import enable_mixed_precision


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(),
                                        torch.nn.LayerNorm(32), torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.body(x)


def train(device, wrap_by_hand, steps=5, loss_module=False):
    torch.manual_seed(0)
    model = Net().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 16).to(device), torch.randint(0, 4, (8,)).to(device)
    criterion = torch.nn.CrossEntropyLoss()
    losses = []
    for _ in range(steps):
        if wrap_by_hand:
            with torch.autocast(device, torch.bfloat16):
                out = model(x)
                loss = criterion(out, y) if loss_module else None
        else:
            out = model(x)
            loss = criterion(out, y) if loss_module else None
        if loss is None:
            loss = torch.nn.functional.cross_entropy(out, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, out.dtype


@pytest.mark.parametrize("loss_module", [False, True])
def test_same_losses_as_the_hand_written_twin(loss_module):
    plain = train("cpu", False, loss_module=loss_module)
    twin = train("cpu", True, loss_module=loss_module)
    undo = enable_mixed_precision("cpu", torch.bfloat16)
    try:
        auto = train("cpu", False, loss_module=loss_module)
    finally:
        undo()
    assert twin[1] == torch.bfloat16 and plain[1] == torch.float32
    assert auto == twin
    assert auto[0] != plain[0]
    assert train("cpu", False, loss_module=loss_module) == plain  # hooks gone


@pytest.mark.torch_feature("autocast_cpu_float16")
def test_user_autocast_wins():
    torch.manual_seed(0)
    model, x = Net(), torch.randn(2, 16)
    undo = enable_mixed_precision("cpu", torch.bfloat16)
    try:
        assert model(x).dtype == torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            assert model(x).dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.float16):
            assert model(x).dtype == torch.float16

        class Inner(torch.nn.Module):  # an autocast inside a forward overrides the hooks'
            def __init__(self):
                super().__init__()
                self.net = Net()

            def forward(self, x):
                with torch.autocast("cpu", enabled=False):
                    return self.net(x)
        assert Inner()(x).dtype == torch.float32
    finally:
        undo()


def test_autocast_left_after_a_forward_that_raises():
    class Boom(torch.nn.Module):
        def forward(self, x):
            assert compat.autocast_enabled("cpu")
            raise ValueError("boom")
    undo = enable_mixed_precision("cpu", torch.bfloat16)
    try:
        with pytest.raises(ValueError):
            Boom()(torch.ones(1))
        assert not compat.autocast_enabled("cpu")
        assert Net()(torch.ones(1, 16)).dtype == torch.bfloat16  # next call starts fresh
    finally:
        undo()
    assert not compat.autocast_enabled("cpu")


@pytest.mark.torch_feature("autocast_cpu_float16")
def test_float16_warns_once_about_loss_scaling_and_bfloat16_does_not():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        enable_mixed_precision("cpu", torch.bfloat16)()
        assert caught == []
        undo = enable_mixed_precision("cpu", torch.float16)
        Net()(torch.ones(1, 16))
        Net()(torch.ones(1, 16))
        undo()
    assert [str(w.message) for w in caught if "GradScaler" in str(w.message)] and len(caught) == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="bfloat16 or torch.float16"):
        enable_mixed_precision("cpu", torch.float32)
    with pytest.raises(ValueError, match="no autocast"):
        enable_mixed_precision("meta", torch.bfloat16)
