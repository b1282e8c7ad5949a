"""YAML text for the plain structures the manifests are built of (dict, list, str, int, bool,
None), with no YAML library: block style, keys in the order given, and every string that a YAML
1.1 or 1.2 reader could take for anything but that string written as a JSON string (JSON's
double-quoted form is valid YAML)."""
from __future__ import annotations

import json
import re
from typing import Any, Iterable, List

#: strings written bare: a letter, ``_`` or ``/`` first, then only these characters
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
#: bare words YAML 1.1 reads as booleans or null
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}


def scalar(value: Any) -> str:
    """One scalar as YAML text; TypeError for anything but str, int, bool and None."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and value.lower() not in _RESERVED:
            return value
        return json.dumps(value, ensure_ascii=True)
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


def _lines(value: Any, indent: str) -> List[str]:
    if isinstance(value, dict):
        if not value:
            return [indent + "{}"]
        out = []
        for key, item in value.items():
            head = f"{indent}{scalar(str(key))}:"
            if isinstance(item, (dict, list)) and item:
                out.append(head)
                out += _lines(item, indent + ("" if isinstance(item, list) else "  "))
            else:
                out.append(f"{head} {_inline(item)}")
        return out
    if isinstance(value, list):
        if not value:
            return [indent + "[]"]
        out = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = _lines(item, indent + "  ")
                out.append(f"{indent}- {inner[0][len(indent) + 2:]}")
                out += inner[1:]
            else:
                out.append(f"{indent}- {_inline(item)}")
        return out
    return [indent + scalar(value)]


def _inline(value: Any) -> str:
    if value == {} and isinstance(value, dict):
        return "{}"
    if value == [] and isinstance(value, list):
        return "[]"
    return scalar(value)


def dump(document: Any) -> str:
    """``document`` as one YAML document, ending with a newline."""
    return "\n".join(_lines(document, "")) + "\n"


def dump_all(documents: Iterable[Any]) -> str:
    """Several documents, separated by ``---`` lines."""
    return "---\n" + "---\n".join(dump(d) for d in documents)
