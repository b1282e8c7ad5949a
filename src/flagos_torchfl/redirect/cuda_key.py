"""What reaches PyTorch's CUDA dispatch key: operators called with a CUDA device, and kernels
libraries register for CUDA (filled in by the CUDA-surface work)."""
from __future__ import annotations
