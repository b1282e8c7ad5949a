"""Reading operator schemas: argument binding, mutated arguments, aliasing returns, and the
functional variant of an in-place or ``out=`` overload."""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Optional, Tuple

import torch

from ..aten.dispatcher import written_args  # noqa: F401  (the routing layer asks it here too)

OpOverload = torch._ops.OpOverload


def qualified_name(op: OpOverload) -> str:
    """The dispatcher's name: ``"aten::add.Tensor"``, ``"aten::relu"`` for a default overload."""
    return op.name()


def bind(op: OpOverload, args: tuple, kwargs: dict) -> Dict[str, Any]:
    """Argument name -> value for a call, defaults filled in."""
    bound: Dict[str, Any] = {}
    for i, arg in enumerate(op._schema.arguments):
        if not arg.kwarg_only and i < len(args):
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            bound[arg.name] = None
    return bound


def split_call(op: OpOverload, bound: Dict[str, Any]) -> Tuple[list, dict]:
    """(args, kwargs) to call ``op`` with the bound values (kwarg-only arguments by name)."""
    args, kwargs = [], {}
    for arg in op._schema.arguments:
        if arg.name not in bound:
            continue
        if arg.kwarg_only:
            kwargs[arg.name] = bound[arg.name]
        else:
            args.append(bound[arg.name])
    return args, kwargs



@functools.lru_cache(maxsize=None)
def return_aliases(op: OpOverload) -> Tuple[Optional[Tuple[str, bool]], ...]:
    """Per return: None for a fresh tensor, else (name of the argument it aliases, written?)."""
    aliased_args = [(a.name, a.alias_info) for a in op._schema.arguments if a.alias_info is not None]
    result: List[Optional[Tuple[str, bool]]] = []
    for ret in op._schema.returns:
        info = ret.alias_info
        if info is None:
            result.append(None)
            continue
        match = [name for name, a_info in aliased_args if set(a_info.before_set) & set(info.before_set)]
        if not match and aliased_args:
            match = [aliased_args[0][0]]
        result.append((match[0], bool(info.is_write)) if match else None)
    return tuple(result)


def is_view(op: OpOverload) -> bool:
    """True when some return is a view of an input (not written through)."""
    return any(r is not None and not r[1] for r in return_aliases(op))


def _signature(op: OpOverload, skip: Tuple[str, ...]) -> Tuple[Tuple[str, str], ...]:
    return tuple((a.name, str(a.type)) for a in op._schema.arguments if a.name not in skip)


@functools.lru_cache(maxsize=None)
def functional_variant(op: OpOverload) -> Optional[OpOverload]:
    """For ``foo_`` / ``foo.out`` (and other ``out=`` overloads): the non-mutating overload that
    takes the same arguments minus the written ``out`` ones; None when there is none."""
    written = written_args(op)
    if not written:
        return None
    schema = op._schema
    name = schema.name.partition("::")[2]
    in_place = written == ("self",) and name.endswith("_") and not name.endswith("__")
    packet_name = name[:-1] if in_place else name
    skip = () if in_place else written
    wanted = _signature(op, skip)
    packet = getattr(torch.ops.aten, packet_name, None)
    if packet is None:
        return None
    for candidate_name in packet.overloads():
        candidate = getattr(packet, candidate_name)
        if candidate._schema.is_mutable or is_view(candidate):
            continue
        if _signature(candidate, ()) == wanted:
            return candidate
    return None
