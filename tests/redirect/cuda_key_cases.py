"""The cases of what reaches PyTorch's CUDA dispatch key (``redirect/cuda_key.py``): operators
called directly with a CUDA device, and kernels libraries register for CUDA. The modules that
import them name the backend (``BACKEND``) and, for the sim, the profile (``PROFILE``; None: the
plain sim); sim modules run in fresh interpreters, since PrivateUse1 is claimed once per process."""
from __future__ import annotations

import itertools
import os
import warnings

import pytest
import torch

import flagos_torchfl as ft
from flagos_torchfl.redirect import cuda_key

_names = (f"t{i}" for i in itertools.count())


def _activate(module):
    """Activate ``module``'s backend (two devices) from a clean ``FL_*`` environment."""
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    if getattr(module, "PROFILE", None):
        os.environ["FL_SIM_PROFILE"] = module.PROFILE
    os.environ["FL_SIM_DEVICES" if module.BACKEND == "sim" else "FL_CPU_DEVICES"] = "2"
    ft.deactivate()
    return ft.init_backend(module.BACKEND)


@pytest.fixture
def environment():
    """The ``FL_*`` variables as they were, afterwards; the package deactivated."""
    saved = {n: v for n, v in os.environ.items() if n.startswith("FL_")}
    yield
    ft.deactivate()
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ.update(saved)


@pytest.fixture
def chip(request, environment):
    """The module's backend, activated with two devices; deactivated afterwards."""
    return _activate(request.module)


@pytest.fixture
def library():
    """A fresh namespace's ``DEF`` library (its operators are gone afterwards)."""
    lib = torch.library.Library(next(_names), "DEF")
    yield lib
    lib._destroy()


def _ns(lib):
    return getattr(torch.ops, lib.ns)


DEVICE_CALLS = {
    "arange.start_step": lambda d: torch.ops.aten.arange.start_step(0, 8, 2, device=d),
    "empty.memory_format": lambda d: torch.ops.aten.empty.memory_format([2], device=d).fill_(1),
    "zeros": lambda d: torch.ops.aten.zeros.default([3], device=d),
    "full": lambda d: torch.ops.aten.full.default([2], 2.5, device=d),
    "randn": lambda d: torch.ops.aten.randn.default([3], device=d).abs().ge(0),
    "scalar_tensor": lambda d: torch.ops.aten.scalar_tensor.default(3.0, device=d),
    "empty_strided": lambda d: torch.ops.aten.empty_strided.default([2, 2], [1, 2], device=d).fill_(0),
    "_to_copy": lambda d: torch.ops.aten._to_copy.default(torch.arange(3.0), device=d),
    "empty_like": lambda d: torch.ops.aten.empty_like.default(torch.ones(2), device=d).fill_(4),
    "linspace": lambda d: torch.ops.aten.linspace.default(0, 1, 5, device=d),
    "eye": lambda d: torch.ops.aten.eye.default(3, device=d),
}


@pytest.mark.parametrize("call", sorted(DEVICE_CALLS))
def test_an_operator_called_with_a_cuda_device_runs_on_the_backend(chip, call):
    result = DEVICE_CALLS[call](torch.device("cuda"))
    assert result.device == chip.chip.torch_device(chip.devices[0])
    assert torch.equal(result.cpu(), DEVICE_CALLS[call](torch.device("cpu")))


def test_a_logical_index_names_the_physical_device(chip):
    result = torch.ops.aten._to_copy.default(torch.ones(2), device=torch.device("cuda", 1))
    assert result.device == chip.chip.torch_device(chip.devices[1])
    with pytest.raises(ft.DeviceOrdinalError, match="cuda:2 does not exist"):
        torch.ops.aten.zeros.default([1], device=torch.device("cuda", 2))


def test_autograd_flows_through_a_cuda_device_copy(chip):
    x = torch.ones(3, requires_grad=True)
    torch.ops.aten._to_copy.default(x, device=torch.device("cuda")).sum().backward()
    assert x.grad.tolist() == [1.0, 1.0, 1.0]


@pytest.mark.full  # Inductor checks its compiled library in a child interpreter
def test_compiled_code_making_a_cuda_range_runs(chip):
    def f(x):
        return x + torch.arange(x.shape[0], device="cuda")

    x = torch.ones(4, device="cuda")
    assert torch.compile(f)(x).cpu().tolist() == [1.0, 2.0, 3.0, 4.0]


def test_a_library_kernel_for_cuda_registered_before_activation_runs_on_the_chip(request, environment, library):
    ft.deactivate()
    library.define("double_it(Tensor x) -> Tensor")
    library.impl("double_it", lambda x: x * 2, "CUDA")
    selection = _activate(request.module)
    assert _ns(library).double_it(torch.ones(2, device="cuda")).tolist() == [2.0, 2.0]
    ft.deactivate()
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"{library.ns}::double_it",
                                                               selection.chip.dispatch_key)


def test_kernels_registered_for_cuda_while_active_run_on_the_chip(chip, library):
    ns = library.ns
    library.define("double_it(Tensor x) -> Tensor")
    library.impl("double_it", lambda x: x * 2, "CUDA")

    @torch.library.custom_op(f"{ns}::plus_one", mutates_args=(), device_types="cuda")
    def plus_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    torch.library.define(f"{ns}::triple", "(Tensor x) -> Tensor", lib=library)
    torch.library.impl(f"{ns}::triple", "cuda", lambda x: x * 3, lib=library)
    library.define("minus_one(Tensor x) -> Tensor")
    torch.library.register_kernel(f"{ns}::minus_one", "cuda", lambda x: x - 1, lib=library)
    x = torch.ones(2, device="cuda")
    assert _ns(library).double_it(x).tolist() == [2.0, 2.0]
    assert plus_one(x).tolist() == [2.0, 2.0]
    assert _ns(library).triple(x).tolist() == [3.0, 3.0]
    assert _ns(library).minus_one(x).tolist() == [0.0, 0.0]


def test_a_kernel_of_the_chips_own_or_a_composite_is_kept(chip, library):
    key = chip.chip.dispatch_key
    library.define("own(Tensor x) -> Tensor")
    library.impl("own", lambda x: x * 10, "CUDA")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the library's own kernel replaces the mirror silently
        library.impl("own", lambda x: x * 100, key)

    @torch.library.custom_op(f"{library.ns}::generic", mutates_args=())
    def generic(x: torch.Tensor) -> torch.Tensor:
        return x - 5

    generic.register_kernel("cuda")(lambda x: x + 5)
    x = torch.ones(1, device="cuda")
    assert _ns(library).own(x).tolist() == [100.0]
    assert generic(x).tolist() == [-4.0]


def test_deactivation_removes_every_mirror(chip, library):
    key = chip.chip.dispatch_key
    library.define("double_it(Tensor x) -> Tensor")
    library.impl("double_it", lambda x: x * 2, "CUDA")
    name = f"{library.ns}::double_it"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    ft.deactivate()
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(name, key)
    if not torch.cuda.is_available():  # as without the package: no device behind "cuda"
        with pytest.raises(RuntimeError):
            torch.ops.aten.zeros.default([1], device="cuda")


def test_a_triton_op_is_refused_naming_the_reason(chip, library):
    @torch.library.triton_op(f"{library.ns}::add_one", mutates_args=())
    def add_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    with pytest.raises(NotImplementedError, match=rf"does not run Triton.*{chip.device_type}"):
        add_one(torch.ones(1, device="cuda"))


try:
    import triton
    import triton.language as tl
except ImportError:  # a launch needs Triton installed
    add_one_kernel = None
else:
    @triton.jit
    def add_one_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) + 1, mask=mask)


def test_a_triton_launch_from_a_cuda_kernel_is_refused_naming_the_reason(chip, library):
    if add_one_kernel is None:
        pytest.skip("Triton is not installed")

    @torch.library.custom_op(f"{library.ns}::add_one", mutates_args=(), device_types="cuda")
    def add_one(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        torch.library.wrap_triton(add_one_kernel)[(1,)](x, y, x.numel(), BLOCK=16)
        return y

    with pytest.raises(NotImplementedError, match="'add_one_kernel' .wrap_triton. needs Triton"):
        add_one(torch.ones(4, device="cuda"))


def test_the_operators_come_from_the_dispatcher():
    found = cuda_key.device_operators()
    for name in ("aten::empty.memory_format", "aten::arange.start_step", "aten::_to_copy",
                 "aten::scalar_tensor", "aten::empty_strided", "aten::full", "aten::randn"):
        assert name in found
    assert "aten::add.Tensor" not in found and "prims::maximum_value" not in found
