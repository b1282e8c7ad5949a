"""The CUDA surface of the installed torch and what each backend does with it.

:mod:`.entries` generates the surface from torch itself: every ATen operator with a ``Device``
argument, and every public function, class or method of torch's device-facing namespaces that
takes a device, a device type, a stream or a dispatch key, or whose name says CUDA, NCCL, cuDNN or
NVTX (the whole public ``torch.cuda`` namespace is in it). :mod:`.table` loads the classification
table (``data/cuda_surface.json``) and gives each entry its verdict on a backend kind:
``redirected`` (a named patch translates the device), ``answered`` (the backend answers, with
what), ``passed`` (device-agnostic) or ``refused`` (why; the chip's counterpart where its vendor's
module has one). An entry no rule matches is *unclassified*: a new entry point of a new torch
release shows up there, and the ``surface`` command and the test suite fail on it.

Only the ``surface`` command and the tests import this package.
"""
