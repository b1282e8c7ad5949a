"""Training steps: one per outermost ``Optimizer.step()``. torchtitan's ``OptimizersContainer``
(an Optimizer whose step runs one inner optimizer per model part) made every per-step figure of
``run --report`` half what it was and the pool's clear interval fire twice as often."""
from __future__ import annotations

import pytest
import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from flagos_torchfl import optimizer_steps

pytestmark = pytest.mark.isolated  # torch 2.1: an earlier torch.compile in the process takes the step hooks off


class Container(torch.optim.Optimizer):
    """One optimizer stepping several (as torchtitan's OptimizersContainer does)."""

    def __init__(self, parts):
        self.parts = parts
        params = [p for part in parts for group in part.param_groups for p in group["params"]]
        super().__init__(params, {})

    def step(self, closure=None):
        for part in self.parts:
            part.step()


def _sgd(seed):
    p = torch.nn.Parameter(torch.full((2,), float(seed)))
    p.grad = torch.ones(2)
    return torch.optim.SGD([p], lr=0.1)


@pytest.fixture
def counted():
    seen = []
    undo = optimizer_steps.after_each_step(seen.append)
    yield seen
    undo()


def test_a_container_of_optimizers_is_one_step(counted):
    container = Container([_sgd(1), _sgd(2)])
    for _ in range(3):
        container.step()
    assert counted == [container] * 3


def test_separate_optimizers_are_a_step_each(counted):
    generator, discriminator = _sgd(1), _sgd(2)
    generator.step()
    discriminator.step()
    assert counted == [generator, discriminator]


def test_a_step_that_raised_does_not_stop_the_count(counted):
    class Failing(torch.optim.SGD):
        fail = True

        def step(self, closure=None):
            if Failing.fail:
                raise RuntimeError("inf in gradients")
            return super().step(closure)

    p = torch.nn.Parameter(torch.ones(1))
    p.grad = torch.ones(1)
    failing = Failing([p], lr=0.1)
    with pytest.raises(RuntimeError):
        failing.step()
    Failing.fail = False
    failing.step()
    other = _sgd(3)
    other.step()
    assert counted == [failing, other]


def test_the_undo_removes_torch_s_global_hooks():
    pre, post = dict(_global_optimizer_pre_hooks), dict(_global_optimizer_post_hooks)
    seen = []
    first = optimizer_steps.after_each_step(seen.append)
    second = optimizer_steps.after_each_step(seen.append)
    assert len(_global_optimizer_pre_hooks) == len(pre) + 1  # one pair of hooks, however many callbacks
    _sgd(1).step()
    assert len(seen) == 2
    first()
    second()
    assert dict(_global_optimizer_pre_hooks) == pre and dict(_global_optimizer_post_hooks) == post
