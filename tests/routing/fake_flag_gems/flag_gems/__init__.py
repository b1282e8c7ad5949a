"""A stand-in for FlagGems' registration table (the real package needs Triton and a GPU): the
same ``_FULL_CONFIG`` shapes -- (name, fn), (name, fn, condition), (name, fn, condition, keys)."""
import torch

device = "npu"


def gelu(x, approximate="none"):
    return torch.nn.functional.gelu(x, approximate=approximate)


def mm(a, b):
    return a @ b


def ctc_loss(*args, **kwargs):
    raise NotImplementedError


_FULL_CONFIG = (
    ("gelu", gelu),
    ("mm", mm, lambda: True),
    ("addmm", mm, lambda: False),
    ("ctc_loss.IntList", ctc_loss, None, ("Autograd",)),
    ("add.Tensor", torch.add),
)
