"""Sparse tensors on the sim (COO and CSR) compute what they compute on the CPU: made from sim
tensors, coalesced, added, multiplied, moved between host and device, and an
``nn.Embedding(sparse=True)`` trains as it trains on the CPU."""
from __future__ import annotations

import os

import pytest
import torch

import flagos_torchfl as ft

pytestmark = [pytest.mark.isolated, pytest.mark.needs_sim]


@pytest.fixture(scope="module")
def sim():
    from flagos_torchfl.sim.operators import sparse

    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ["FL_SIM_RUNTIME"] = "python"
    ft.init_backend("sim")
    library = torch.library.Library("aten", "IMPL")
    sparse.register(library)
    assert sparse.register(library) == 0  # once per overload
    yield torch.sim
    ft.deactivate()


def test_the_sparse_kernels_come_from_the_dispatcher(sim):
    from flagos_torchfl.sim.operators.sparse import KEYS, overloads

    for key, cpu_key in KEYS.items():
        names = overloads(cpu_key)
        assert len(names) > 50
        assert all(torch._C._dispatch_has_kernel_for_dispatch_key(n, key) for n in names)


def test_coo_tensors_compute_as_on_the_cpu(sim):
    dense = torch.tensor([[0.0, 2.0, 0.0], [3.0, 0.0, 0.0], [0.0, 0.0, 4.0]])
    s = dense.to("sim").to_sparse()
    assert s.device.type == "sim" and s.layout == torch.sparse_coo
    assert s._indices().device.type == "sim" and s._nnz() == 3
    assert torch.equal(s.to_dense().cpu(), dense)
    assert torch.equal((s * 2 + s).coalesce().to_dense().cpu(), dense * 3)
    other = torch.randn(3, 2)
    torch.testing.assert_close(torch.sparse.mm(s, other.to("sim")).cpu(), dense @ other)
    assert torch.sparse.sum(s).item() == 9.0
    made = torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]], device="sim"),
                                   torch.tensor([1.0, 2.0], device="sim"), (2, 2))
    assert made.device.type == "sim" and made.to_dense().cpu().tolist() == [[0, 1], [2, 0]]
    assert torch.equal(s.cpu().to_dense(), dense) and s.cpu().device.type == "cpu"
    assert torch.equal(dense.to_sparse().to("sim").to_dense().cpu(), dense)


def test_csr_tensors_compute_as_on_the_cpu(sim):
    dense = torch.eye(3) * torch.tensor([1.0, 2.0, 3.0])
    csr = dense.to("sim").to_sparse_csr()
    assert csr.layout == torch.sparse_csr and csr.device.type == "sim"
    assert torch.equal(csr.to_dense().cpu(), dense)
    assert torch.equal((csr @ torch.ones(3, device="sim")).cpu(), dense @ torch.ones(3))


def test_sparse_embedding_trains_as_on_the_cpu(sim):
    def train(device):
        torch.manual_seed(0)
        embedding = torch.nn.Embedding(10, 3, sparse=True).to(device)
        optimizer = torch.optim.SGD(embedding.parameters(), lr=0.1)
        for step in range(3):
            optimizer.zero_grad()
            loss = embedding(torch.tensor([1, 2, 1, step], device=device)).pow(2).sum()
            loss.backward()
            assert embedding.weight.grad.layout == torch.sparse_coo
            optimizer.step()
        return embedding.weight.detach().cpu()

    torch.testing.assert_close(train("sim"), train("cpu"))
