"""Run the examples of PyTorch's CUDA-graphs documentation (``tests/fixtures/pytorch_docs``) as
their text stands, each next to its eager twin, and print one JSON record per example.

Usage: ``graph_doc_examples.py RST``. An example is the literal block of a section (``PyTorch
API``, ``Whole-network capture``, ``Partial-network capture``), run in a namespace holding what the
documentation takes as imported (``torch``, ``itertools.chain``) after ``torch.manual_seed(0)``.
Its eager twin is the same text with the graph calls made eager, by rules the documentation
states: a ``torch.cuda.graph`` block becomes a function called at each ``replay()`` (the capture
runs nothing; the captured backward refills the ``.grad`` tensors, so the function starts with
``optimizer.zero_grad(set_to_none=True)``), and ``make_graphed_callables`` returns the callable it
was given. The record holds the largest difference between the two runs' tensors (parameters,
losses, outputs; not the sample inputs of ``make_graphed_callables``, into which the graphed
callables copy each real input, as CUDA's do) and what the examples print.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import sys
from itertools import chain

import torch

SECTIONS = ("PyTorch API", "Whole-network capture", "Partial-network capture")


def literal_blocks(text: str) -> dict:
    """The first literal block (the indented text after a paragraph ending in ``::``, not a
    directive's) of each section of ``SECTIONS``, dedented."""
    lines, found, title = text.splitlines(), {}, None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and re.fullmatch(r"([-^~])\1{3,}", lines[i + 1]) and line.strip():
            title = line.strip()
        directive = line.lstrip().startswith("..")
        if title in SECTIONS and title not in found and line.rstrip().endswith("::") and not directive:
            block = []
            for follow in lines[i + 1:]:
                if follow.strip() and not follow.startswith("    "):
                    break
                block.append(follow[4:])
            found[title] = "\n".join(block).strip("\n") + "\n"
    missing = [s for s in SECTIONS if s not in found]
    if missing:
        raise SystemExit(f"no example found in the sections {missing}")
    return found


def sample_inputs(code: str) -> set:
    """The names ``code`` passes to ``make_graphed_callables`` as sample inputs."""
    calls = re.findall(r"torch\.cuda\.make_graphed_callables\(\w+, \((.*)\)\)", code)
    return {name.strip() for call in calls for name in call.split(",") if name.strip()}


def eager_twin(code: str) -> str:
    """``code`` with its graphs made eager (see the module's docstring)."""
    out, lines, i = [], code.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        captured = re.fullmatch(r"(\s*)with torch\.cuda\.graph\((\w+)\):", line)
        if captured:
            indent, graph = captured.groups()
            body = []
            i += 1
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith(indent + "    ")):
                body.append(lines[i])
                i += 1
            names = sorted({m for b in body for m in re.findall(r"^\s*(\w+)\s*=", b)})
            out += [f"{indent}def _replay_{graph}():",
                    f"{indent}    global {', '.join(names)}" if names else f"{indent}    pass",
                    f"{indent}    optimizer.zero_grad(set_to_none=True)" if "backward()" in "".join(body) else "",
                    *body]
            code_rest = "\n".join(lines[i:])
            lines = lines[:i] + code_rest.replace(f"{graph}.replay()", f"_replay_{graph}()").splitlines()
            continue
        out.append(re.sub(r"torch\.cuda\.make_graphed_callables\((\w+), .*\)$", r"\1", line))
        i += 1
    return "\n".join(out) + "\n"


def run(code: str) -> tuple:
    """Execute ``code`` after ``torch.manual_seed(0)``; returns its namespace and what it printed."""
    torch.manual_seed(0)
    namespace = {"torch": torch, "chain": chain, "__name__": "__example__"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "<example>", "exec"), namespace)
    torch.cuda.synchronize()
    return namespace, printed.getvalue()


def tensors(namespace: dict, leave: set) -> dict:
    """Every tensor the example left in its namespace (by name; not those named in ``leave``) and
    every parameter of its optimizers (by position), on the CPU."""
    found = {}
    for name, value in namespace.items():
        if isinstance(value, torch.Tensor) and name not in leave:
            found[name] = value.detach().cpu()
        elif isinstance(value, torch.optim.Optimizer):
            for k, p in enumerate(q for group in value.param_groups for q in group["params"]):
                found[f"{name}.param{k}"] = p.detach().cpu()
    return found


def main() -> None:
    examples = literal_blocks(open(sys.argv[1], encoding="utf-8").read())
    for title, code in examples.items():
        graphed, printed = run(code)
        eager, eager_printed = run(eager_twin(code))
        leave = sample_inputs(code)
        ours, theirs = tensors(graphed, leave), tensors(eager, leave)
        assert ours.keys() == theirs.keys(), (sorted(ours), sorted(theirs))
        difference = max((ours[k] - theirs[k]).abs().max().item() for k in ours)
        print(json.dumps({"tag": "example", "title": title, "tensors": len(ours), "difference": difference,
                          "device": str(graphed.get("static_input", graphed.get("x")).device),
                          "printed": printed, "eager_printed": eager_printed}), flush=True)


if __name__ == "__main__":
    main()
