"""``torch.compile`` on a chip whose plugin brings no Inductor code generator.

Inductor compiles a graph with the code generator registered for its tensors' device type
(PyTorch's own for CUDA, ROCm, XPU, MPS and the CPU; torch_npu's and torch_musa's for theirs; the
sim's host C++ one, ``sim/integration/inductor.py``). Where a graph's device type has none, Inductor fails
inside code generation. Under activation such a graph is compiled with ``aot_eager`` instead — the
traced ATen graph, with autograd, run on the chip's own kernels: no fusion, and no result eager
mode would not give — with one warning per device type naming the chip and the fallback.
"""
from __future__ import annotations

import functools
import importlib
import types
import warnings
from typing import Any, Iterable, Iterator

import torch

from .. import compat
from .cuda_facade import asked_by_torch_accelerator
from .devices import Target
from .factories import original_of
from ..patching import Patcher
from .patches import patch_function

FALLBACK = "aot_eager"
"""The dynamo backend a graph without an Inductor code generator is compiled with."""


def devices_without_inductor(inputs: Iterable[Any]) -> list[str]:
    """The device types of the tensors among ``inputs`` that Inductor has no code generator for
    (after letting it register every backend it knows, the plugins' included), sorted."""
    types = {x.device.type for x in inputs if isinstance(x, torch.Tensor)} - {"meta"}
    return sorted(t for t in types if not compat.inductor_has_codegen(t))


@patch_function("compile_fallback")
def patch_compile_fallback(target: Target, patcher: Patcher) -> None:
    """``torch.compile(..., backend="inductor")`` (the default): a graph whose tensors are on a
    device type without an Inductor code generator is compiled with :data:`FALLBACK`, with one
    warning per device type; every other graph goes to Inductor unchanged."""
    wrapper = torch._TorchCompileInductorWrapper
    original = wrapper.__call__
    warned: set = set()

    @functools.wraps(original)
    def __call__(self, model_, inputs_, **kwargs):
        missing = devices_without_inductor(inputs_)
        if not missing:
            return original(self, model_, inputs_, **kwargs)
        fresh = [t for t in missing if t not in warned]
        if fresh:
            warned.update(fresh)
            warnings.warn(
                f"torch.compile: Inductor has no code generator for device type "
                f"{', '.join(map(repr, fresh))} (backend {target.chip.name!r}: its plugin brings "
                f"none); compiling with backend {FALLBACK!r} instead (the traced graph runs on "
                "the chip's own kernels, without fusion)", stacklevel=2)
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend(FALLBACK)(model_, inputs_)

    patcher.setattr(wrapper, "__call__", __call__)


@patch_function("compile_cudagraph_checks", waits_for="torch._inductor.cudagraph_utils")
def patch_compile_cudagraph_checks(target: Target, patcher: Patcher) -> None:
    """``torch.compile(mode="reduce-overhead")``: Inductor's check of CUDA's caching allocator
    before it graphs a compiled function (``check_caching_allocator_for_cudagraphs``) asks the
    real ``torch.cuda`` whether CUDA is there, as it does without this package: the facade's
    True sent it to CUDA's allocator query, which a torch without CUDA lacks (an AttributeError
    inside every such compilation). Inductor then skips graphs for the chip's tensors with its own
    reason, as plain torch does for the CPU's ("skipping cudagraphs due to cpu device")."""
    from torch._inductor import cudagraph_utils

    original = getattr(cudagraph_utils, "check_caching_allocator_for_cudagraphs", None)
    if original is None:  # a torch before the check asks nothing of torch.cuda there
        return

    @functools.wraps(original)
    def check_caching_allocator_for_cudagraphs(*args: Any, **kwargs: Any) -> Any:
        with asked_by_torch_accelerator:
            return original(*args, **kwargs)

    patcher.setattr(cudagraph_utils, "check_caching_allocator_for_cudagraphs",
                    check_caching_allocator_for_cudagraphs)


_DESCRIPTORS = (types.MethodDescriptorType, types.WrapperDescriptorType, types.BuiltinFunctionType)


@patch_function("compile_traces_torch_functions", waits_for="torch._dynamo.trace_rules")
def patch_trace_rules(target: Target, patcher: Patcher) -> None:
    """dynamo's table of torch's functions (built from torch's names the first time it traces)
    holds the functions the factory wrappers wrap, never the wrappers: dynamo then inlines a
    wrapper, whose device translation stays in the traced program, and traces the original in it
    as torch's own — also after a later activation made new wrappers, and under
    ``with torch.device(...)``. Were the table built from the wrappers, dynamo would call an
    activation's wrapper opaquely and not know the original the next activation's calls."""
    from torch._dynamo import trace_rules

    original = trace_rules.load_object

    def load_object(name: str) -> Any:
        return original_of(original(name))

    patcher.setattr(trace_rules, "load_object", load_object)
    # the Tensor methods dynamo puts in the graph, read from torch.Tensor's attributes: a
    # wrapped method (Tensor.new_ones ...) is a Python function there, so the method it wraps
    # is added, or a wrapper's call of it would break the graph (torchtitan's compiled
    # create_block_mask calls new_ones)
    tensor_methods = trace_rules.get_tensor_method

    @functools.cache
    def get_tensor_method() -> frozenset:
        wrapped = (original_of(getattr(torch.Tensor, name, None)) for name in dir(torch.Tensor))
        return tensor_methods() | frozenset(m for m in wrapped if isinstance(m, _DESCRIPTORS))

    patcher.setattr(trace_rules, "get_tensor_method", get_tensor_method)


@patch_function("compile_keeps_step_hooks", waits_for="torch._dynamo.eval_frame")
def patch_compile_keeps_step_hooks(target: Target, patcher: Patcher) -> None:
    """Where ``torch.compile`` takes the step-hook wrapper off every ``torch.optim`` optimizer's
    ``step`` (torch 2.1's dynamo does, once per process, in ``TorchPatcher.patch`` at the first
    compile), the wrapper is put back — after that compile, or at activation if it came before:
    the global step hooks (the cpu backend's memory limit, the pool's clear interval, the routing
    report's step count, the program's own) keep running."""
    if not compat.has("dynamo_unhooks_optimizer_steps"):
        return
    from torch._dynamo.eval_frame import TorchPatcher

    original = vars(TorchPatcher)["patch"].__func__
    hooked_code = torch.optim.Optimizer.profile_hook_step(lambda *a, **k: None).__code__

    def rehook() -> None:
        for optimizer in vars(torch.optim).values():
            if not (isinstance(optimizer, type) and issubclass(optimizer, torch.optim.Optimizer)):
                continue
            step = vars(optimizer).get("step")
            # dynamo marks the step it unwrapped "hooked", so torch never wraps it again
            if getattr(step, "hooked", False) and getattr(step, "__code__", None) is not hooked_code:
                rehooked = torch.optim.Optimizer.profile_hook_step(step)
                rehooked.hooked = True
                patcher.setattr(optimizer, "step", rehooked)

    @functools.wraps(original)
    def patch() -> None:
        original()
        rehook()

    patcher.setattr(TorchPatcher, "patch", staticmethod(patch))
    rehook()


def _code_objects(module: types.ModuleType) -> Iterator[types.CodeType]:
    """Every code object defined in ``module``: its functions', its classes' methods' and
    properties', and the nested ones in them (closures made at run time share these)."""
    def nested(code: types.CodeType) -> Iterator[types.CodeType]:
        yield code
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                yield from nested(const)

    def functions(namespace: dict) -> Iterator[Any]:
        for value in namespace.values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, property):
                yield from (f for f in (value.fget, value.fset, value.fdel) if f is not None)
            elif isinstance(value, types.FunctionType):
                yield value

    for value in list(vars(module).values()):
        if getattr(value, "__module__", None) != module.__name__:
            continue
        if isinstance(value, type):
            found = functions(vars(value))
        else:
            found = functions({"": value})
        for function in found:
            yield from nested(function.__code__)


@patch_function("compile_device_interface", waits_for="torch._dynamo.device_interface")
def patch_compile_device_interface(target: Target, patcher: Patcher) -> None:
    """Dynamo's device interface for the chip's device type, where the chip brings one that
    nothing else registers (``Backend.dynamo_device_interface``: the sim's), as soon as dynamo
    loads: ``get_interface_for_device`` answers before Inductor's first compilation (streams,
    device properties and synchronisation inside compiled code ask it)."""
    interface = target.chip.dynamo_device_interface()
    if interface is None:
        return
    from torch._dynamo import device_interface

    patcher.setitem(device_interface.device_interfaces, target.device_type, interface)


@patch_function("compile_skips_runtime_frames", waits_for="torch._dynamo.eval_frame")
def patch_compile_skips_runtime_frames(target: Target, patcher: Patcher) -> None:
    """Dynamo runs the frames of the chip's Python runtime as they are
    (``Backend.runtime_python_modules``: the sim's kernels, device guard, allocator...), as it
    runs a chip's C++ kernels: torch calls them from C++ while compiled code runs, where dynamo
    would otherwise trace each as a frame of the program (torchtitan's compiled
    ``create_block_mask`` made it trace the sim's kernels to its recompile limit, and objects it
    built while tracing failed in ``__del__``)."""
    modules = target.chip.runtime_python_modules()
    if not modules:
        return
    from torch._dynamo import eval_frame

    codes = [code for name in modules for code in _code_objects(importlib.import_module(name))]
    strategy = getattr(eval_frame, "set_code_exec_strategy", None)

    def skip() -> None:
        for code in codes:
            eval_frame.skip_code(code)

    def unskip() -> None:
        if strategy is None:  # no way to take a mark back on this torch: the frames stay skipped
            return
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        default = FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT)
        for code in codes:
            strategy(code, default)

    patcher.call(skip, unskip, "dynamo skips the chip runtime's frames")
