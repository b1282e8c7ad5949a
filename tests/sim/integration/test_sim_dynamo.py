"""The sim under dynamo: its device interface is registered as soon as dynamo loads
(``compile_device_interface``), and its runtime is as opaque as a chip's C++ one: dynamo traces the
program's frames, never the sim's kernels, device guard or allocator, which torch calls from C++
while compiled code runs (``compile_skips_runtime_frames``)."""
from __future__ import annotations

import logging
import os

import pytest
import torch

import flagos_torchfl as ft

pytestmark = pytest.mark.isolated

SIM_SOURCES = os.path.join("flagos_torchfl", "sim", "")


class Traced(logging.Handler):
    """The frames dynamo starts tracing, from its log ("torchdynamo start tracing NAME FILE:LINE")."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.frames = []

    def emit(self, record):
        message = record.getMessage()
        if "torchdynamo start tracing" in message:
            self.frames.append(message.split("torchdynamo start tracing", 1)[1].strip())


@pytest.fixture(scope="module")
def sim():
    for name in [n for n in os.environ if n.startswith("FL_")]:
        del os.environ[name]
    selection = ft.init_backend("sim")
    yield selection
    ft.deactivate()


def test_dynamo_knows_the_sim_as_soon_as_it_loads(sim):
    """Before Inductor's first compilation (which registers the sim's code generator too)."""
    import torch._dynamo.device_interface as device_interface

    interface = device_interface.get_interface_for_device("sim")
    assert interface.is_available() and interface.device_count() == 1
    assert interface.current_device() == 0


def program(x):
    y = torch.ones(4, device="cuda") * 2
    torch._dynamo.graph_break()  # the rest runs as a frame of its own, its ops through the sim
    z = torch.empty(4, device="cuda").fill_(1)
    return (x + y + z).sum()


def test_dynamo_traces_the_program_and_none_of_the_sim_s_runtime(sim):
    import torch._dynamo
    import torch._logging

    traced = Traced()
    logger = logging.getLogger("torch._dynamo")
    logger.addHandler(traced)
    torch._logging.set_logs(dynamo=logging.INFO)
    try:
        compiled = torch.compile(program, backend="eager")
        got = [compiled(torch.full((4,), float(i), device="cuda")).item() for i in range(4)]
    finally:
        torch._logging.set_logs()
        logger.removeHandler(traced)
    assert got == [program(torch.full((4,), float(i), device="cuda")).item() for i in range(4)]
    assert traced.frames and all("test_sim_dynamo.py" in frame for frame in traced.frames), "\n".join(traced.frames)
    assert not [frame for frame in traced.frames if SIM_SOURCES in frame]
