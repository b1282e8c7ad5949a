"""``torch.nn.DataParallel`` on every backend (filled in by the CUDA-surface work)."""
from __future__ import annotations
