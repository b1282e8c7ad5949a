"""What a device refuses or keeps, checked on the sim against the CPU: imported by the test
modules of each sim runtime (the cases take their ``sim`` fixture, :func:`activated_sim`)."""
from __future__ import annotations

import os
import warnings

import pytest
import torch

import flagos_torchfl as ft


def activated_sim(runtime: str):
    """The sim activated alone (no other FL_ variable) on ``runtime``; deactivated after."""
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    os.environ.update(FL_SIM_RUNTIME=runtime)
    ft.init_backend("sim")
    yield torch.sim
    ft.deactivate()


def test_a_cpu_out_tensor_is_refused_as_a_device_refuses_it(sim):
    t = torch.tensor([[0, 1], [1, 1]], device="sim")
    for out in (torch.empty([], dtype=torch.long), torch.empty([0, 2], dtype=torch.long)):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device.*out"):
            torch.nonzero(t, out=out)
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.add(t, t, out=torch.empty([], dtype=torch.long))
    out = torch.empty([], dtype=torch.long, device="sim")
    torch.nonzero(t, out=out)
    assert out.cpu().tolist() == [[0, 1], [1, 0], [1, 1]]
    # a 0-dim CPU tensor stays a scalar the kernel may read
    assert (t + torch.tensor(1)).cpu().tolist() == [[1, 2], [2, 2]]


@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.channels_last_3d])
def test_resize_as_preserves_the_template_memory_format(sim, memory_format):
    shape = (2, 3, 4, 5) if memory_format is torch.channels_last else (2, 3, 4, 5, 6)
    template = torch.randn(shape).to(memory_format=memory_format)
    for resize_format in (torch.preserve_format, None, torch.contiguous_format):
        kwargs = {} if resize_format is None else {"memory_format": resize_format}
        expected = torch.empty(0).resize_as_(template, **kwargs)
        got = torch.empty(0, device="sim").resize_as_(template.to("sim"), **kwargs)
        assert got.shape == expected.shape and got.stride() == expected.stride(), resize_format


def test_supported_dtypes_are_those_the_device_holds_and_copies(sim):
    from flagos_torchfl.sim.runtime.capability import supported_dtypes

    held = supported_dtypes()
    assert {torch.float32, torch.bfloat16, torch.complex32, torch.bool, torch.float8_e4m3fn,
            torch.uint64} <= held
    assert not held & {torch.int5, torch.uint3, torch.bits8, torch.bits16, torch.quint4x2}
    for dtype in held:
        raw = (torch.arange(4 * dtype.itemsize) % 2).to(torch.uint8)
        back = raw.view(dtype).to("sim").cpu()
        assert back.dtype == dtype and torch.equal(back.view(torch.uint8), raw), dtype


def _cat_outcome(device: str, case: str):
    """What ``torch.cat`` with an ``out=`` that must grow does on ``device``: the error, or the
    result with its geometry."""
    empty, full = torch.zeros(0, device=device), torch.arange(24.0, device=device).reshape(4, 6)
    other = torch.ones(4, 6, device=device)
    calls = {
        "out is an input": lambda: torch.cat([empty, full], out=empty),
        "out views an input's memory": lambda: torch.cat([full, other], out=other[:2, :]),
        "out apart": lambda: torch.cat([full, other], out=torch.empty(0, device=device)),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "An output with one or more elements was resized"
        try:
            out = calls[case]()
        except RuntimeError as exc:
            return str(exc)
    return tuple(out.shape), out.stride(), out.cpu().tolist()


@pytest.mark.parametrize("case", ["out is an input", "out views an input's memory", "out apart"])
def test_an_output_that_grows_is_checked_against_the_inputs_as_on_the_cpu(sim, case):
    assert _cat_outcome("sim", case) == _cat_outcome("cpu", case)


def _set_to_answers(device: str) -> list:
    t1, t2 = torch.empty(3, 4, device=device), torch.empty(3, 4, device=device)
    t3 = torch.tensor([], device=device).set_(t1)
    flags = torch.tensor([True, True], device=device)
    flags_set = torch.tensor([False], device=device).set_(flags)
    base = torch.empty(2, 3, 4, device=device)
    return [t1.is_set_to(t2), t1.is_set_to(t3), t3.is_set_to(t1), flags.is_set_to(flags_set),
            base.is_set_to(base.view(4, 3, 2)), t1.is_set_to(t1[1:]), t1.is_set_to(t1.clone())]


def test_is_set_to_compares_the_device_memory_as_on_the_cpu(sim):
    assert _set_to_answers("sim") == _set_to_answers("cpu") == [False, True, True, True, False, False, False]


def _copy_outcome(device: str, case: str):
    x = torch.arange(6.0, device=device)
    calls = {
        "into an expanded tensor": lambda: torch.zeros(1, device=device).expand(3).copy_(x[:3]),
        "from memory it partly overlaps": lambda: x[:3].copy_(x[1:4]),
        "onto itself": lambda: x[:3].copy_(x[:3]),
        "from other memory of the same storage": lambda: x[:3].copy_(x[3:]),
    }
    try:
        calls[case]()
    except RuntimeError as exc:
        return str(exc)
    return x.cpu().tolist()


@pytest.mark.parametrize("case", ["into an expanded tensor", "from memory it partly overlaps", "onto itself",
                                  "from other memory of the same storage"])
def test_a_copy_within_the_device_memory_is_checked_for_overlap_as_on_the_cpu(sim, case):
    assert _copy_outcome("sim", case) == _copy_outcome("cpu", case)


def _complex_view_outcomes(device: str) -> list:
    base = torch.arange(12.0, device=device)
    cplx = torch.view_as_complex(base.view(6, 2))
    calls = [
        lambda: torch.view_as_complex(base.view(2, 3, 2)),
        lambda: torch.view_as_complex(base[:8].view(4, 2)[:, :1].expand(4, 2)),  # last stride 0
        lambda: torch.view_as_complex(base[0]),  # no dimension
        lambda: torch.view_as_complex(base[1:9].view(4, 2)),  # odd storage offset
        lambda: torch.view_as_complex(base.view(2, 6)),  # last dimension 6
        lambda: torch.view_as_complex(base.to(torch.int32).view(6, 2)),
        lambda: torch.view_as_real(cplx[::2]),
        lambda: torch.view_as_real(cplx.conj()),
        lambda: torch.view_as_real(base),
    ]
    outcomes = []
    for call in calls:
        try:
            view = call()
        except RuntimeError as exc:
            outcomes.append(str(exc))
        else:
            outcomes.append((tuple(view.shape), view.stride(), view.storage_offset(), view.cpu().tolist()))
    return outcomes


def test_complex_views_are_refused_with_atens_words(sim):
    assert _complex_view_outcomes("sim") == _complex_view_outcomes("cpu")
