"""A real, small kernel library for tests: matrix products computed block by block (a different
summation order from ATen's, so results differ in the last bits), built from operators the sim
has natively."""
from __future__ import annotations

import torch

from flagos_torchfl.routing.providers import KernelProvider, ProviderKernel

BLOCK = 3


def blocked_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` accumulated over blocks of ``BLOCK`` columns of ``a``."""
    BlockedMatmul.calls += 1
    out = None
    for k in range(0, a.shape[1], BLOCK):
        part = (a[:, k:k + BLOCK].unsqueeze(2) * b[k:k + BLOCK].unsqueeze(0)).sum(1)
        out = part if out is None else out + part
    return out if out is not None else torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype, device=a.device)


def blocked_mm_out(a, b, *, out):
    result = blocked_mm(a, b)
    out.resize_(result.shape)
    return out.copy_(result)


def blocked_addmm(bias, a, b, *, beta=1, alpha=1):
    return bias * beta + blocked_mm(a, b) * alpha


def blocked_addmm_out(bias, a, b, *, beta=1, alpha=1, out):
    result = blocked_addmm(bias, a, b, beta=beta, alpha=alpha)
    out.resize_(result.shape)
    return out.copy_(result)


class BlockedMatmul(KernelProvider):
    """mm for float32 (with autograd); addmm for float32 without autograd only."""

    name = "blocked-matmul"
    priority = 10
    calls = 0

    def supports(self, backend) -> bool:
        return backend.device_type == "sim"

    def kernels(self, backend):
        f32 = frozenset({torch.float32})
        return [
            ProviderKernel("aten::mm", blocked_mm, dtypes=f32),
            ProviderKernel("aten::mm.out", blocked_mm_out, dtypes=f32),
            ProviderKernel("aten::addmm", blocked_addmm, dtypes=f32, autograd=False),
            ProviderKernel("aten::addmm.out", blocked_addmm_out, dtypes=f32, autograd=False),
        ]


def _raise(*args, **kwargs):
    raise RuntimeError("injected kernel failure")


class Faulty(KernelProvider):
    """A provider whose kernel for ``aten::hardswish`` always raises."""

    name = "faulty"
    priority = 5

    def supports(self, backend) -> bool:
        return backend.device_type == "sim"

    def kernels(self, backend):
        return [ProviderKernel("aten::hardswish", _raise), ProviderKernel("aten::hardswish.out", _raise)]
