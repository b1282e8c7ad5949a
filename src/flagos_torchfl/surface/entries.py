"""The CUDA surface of the installed torch, generated from torch itself.

:func:`generate` lists every entry point through which a CUDA-written program (or a library, or
compiled code) can reach CUDA:

* every operator schema torch knows (``torch._C._jit_get_all_schemas()``) with a ``Device``
  argument (``aten::arange.start_step``: ``device="cuda"`` reaches it from compiled code and from
  ``torch.ops``);
* in the namespaces of :data:`SCANNED`, every public function, class and method that takes a
  device, a device type, a stream or a dispatch key (its parameters read with
  ``inspect.signature``, or, for a C++ binding, from the signatures its docstring or
  ``__text_signature__`` spells), or whose name says CUDA, NCCL, cuDNN or NVTX;
* every public name of the namespaces of :data:`WHOLE` (``torch.cuda`` and its submodules,
  ``torch.backends.cuda`` / ``cudnn``), whatever it takes.

It reads torch as it is in this process: run it before any activation (the ``surface`` command
does), since the redirection replaces some of these objects.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import types
import warnings
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple

#: namespaces whose entries taking a device, a stream or a dispatch key (or named after CUDA) are
#: in the surface; the classes among them are scanned for such methods too
SCANNED = ("torch", "torch.amp", "torch.autograd.profiler", "torch.profiler", "torch.distributed", "torch.library",
           "torch.nn.parallel", "torch.utils.data")
#: classes all of whose public methods (inherited ones included) are scanned
CLASSES = ("torch.Tensor", "torch.UntypedStorage", "torch.TypedStorage", "torch.nn.Module")
#: C++ classes constructed on a device whose signature torch spells nowhere (no docstring, no
#: text signature), each with what it takes
UNSPELLED = {"torch.device": "device", "torch.Generator": "device", "torch.is_autocast_enabled": "device",
             "torch.get_autocast_dtype": "device", "torch.set_autocast_enabled": "device",
             "torch.set_autocast_dtype": "device"}
#: namespaces every public name of which is in the surface (those this torch lacks are skipped)
WHOLE = ("torch.cuda", "torch.cuda.amp", "torch.cuda.graphs", "torch.cuda.nvtx", "torch.cuda.memory",
         "torch.cuda.random", "torch.cuda.streams", "torch.backends.cuda", "torch.backends.cudnn")

#: a name that says CUDA, NCCL, cuDNN, NVTX, CUDA's libraries, or the GPU (torch's ``gpu`` names
#: mean CUDA: ``torch.get_autocast_gpu_dtype``)
CUDA_NAME = re.compile(r"cuda|nccl|cudnn|nvtx|cublas|cufft|gpu", re.IGNORECASE)
#: parameter names that take a device or a device type, a stream, a dispatch key, a collective
#: library (``backend="nccl"``)
PARAMETER_KINDS = (
    ("device", re.compile(r"device|^map_location$|^use_cuda$")),
    ("collective", re.compile(r"^backend$")),
    ("stream", re.compile(r"stream")),
    ("dispatch_key", re.compile(r"dispatch_key|^types$")),
)
#: annotations that name a device, a stream or a dispatch key
ANNOTATION_KINDS = (("device", "device"), ("stream", "Stream"), ("dispatch_key", "DispatchKey"))
_SIGNATURE_LINE = re.compile(r"^\s*(?:\d+\.\s*|\.\.\s+\w+::\s*)?([A-Za-z_][\w.]*)\((.*)\)\s*(?:->.*)?$")
_PARAMETER = re.compile(r"(?:^|[(,])\s*\*{0,2}([A-Za-z_]\w*)\s*(?=[:=,)\[]|$)")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One entry point. ``name``: as a program spells it (``torch.cuda.set_device``,
    ``torch.Tensor.to``) or the operator's ``namespace::name.overload`` (``aten::arange.start_step``;
    the default overload without a suffix). ``kind``: ``operator``, ``function``, ``class``,
    ``method`` or ``attribute``. ``namespace``: where it was found (``aten`` for operators).
    ``reasons``: why it is in the surface — ``device``, ``stream``, ``dispatch_key``,
    ``collective`` (it takes one), ``cuda_name`` (its name says CUDA), ``whole`` (a CUDA namespace); ``tags``: what torch
    says of it beyond that (``device_constructor``: in torch's own list of device constructors)."""

    name: str
    kind: str
    namespace: str
    reasons: FrozenSet[str]
    tags: FrozenSet[str] = frozenset()

    def to_json(self) -> Dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "namespace": self.namespace,
                "reasons": sorted(self.reasons), "tags": sorted(self.tags)}


def generate() -> List[Entry]:
    """Every entry of the installed torch's CUDA surface, sorted by name, each name once."""
    found: Dict[str, Entry] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated names warn when read (torch.distributed.reduce_op)
        for entry in (*operators(), *python_entries()):
            found.setdefault(entry.name, entry)
    return sorted(found.values(), key=lambda e: e.name)


# ---------------------------------------------------------------------------- operators
def operators() -> Iterator[Entry]:
    """Every operator schema with a ``Device`` (or ``Device?``) argument."""
    import torch

    for schema in torch._C._jit_get_all_schemas():
        if any("Device" in str(argument.type) for argument in schema.arguments):
            name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
            yield Entry(name, "operator", schema.name.partition("::")[0], frozenset({"device"}))


# ---------------------------------------------------------------------------- python
def python_entries() -> Iterator[Entry]:
    """The entries of :data:`WHOLE`, :data:`CLASSES` and :data:`SCANNED`."""
    constructors = _device_constructor_names()
    for path in WHOLE:
        namespace = _resolve(path)
        if namespace is not None:
            yield from _whole(path, namespace)
    for path in CLASSES:
        cls = _resolve(path)
        if cls is not None:
            yield from _methods(path, cls, inherited=True)
    for path in SCANNED:
        namespace = _resolve(path)
        if namespace is None:
            continue
        for name, value in _public(namespace):
            qualified = f"{path}.{name}"
            if inspect.ismodule(value) or not _defined_in_torch(value):
                continue
            reasons = _reasons(name, value) | frozenset(filter(None, [UNSPELLED.get(qualified)]))
            kind = "class" if inspect.isclass(value) else "function" if callable(value) else "attribute"
            tags = frozenset({"device_constructor"}) if path == "torch" and name in constructors else frozenset()
            if reasons and kind != "attribute" or "cuda_name" in reasons:
                yield Entry(qualified, kind, path, reasons, tags)
            if inspect.isclass(value) and qualified not in CLASSES and not _legacy_tensor_type(value):
                yield from _methods(qualified, value, inherited=False)


def _whole(path: str, namespace: Any) -> Iterator[Entry]:
    """Every public name of a CUDA namespace: its ``__all__``, its public names, and, for a
    module object of torch's own class (``torch.backends.cudnn``), its class's properties and
    the module it wraps. Left out: submodules, ``typing``'s ``TYPE_CHECKING``, and what is not
    torch's own (``typing`` aliases, standard-library functions the module imported)."""
    names = {n for n in getattr(namespace, "__all__", ()) if isinstance(n, str)} | set(dir(namespace))
    if type(namespace) is not types.ModuleType:
        names.update(dir(type(namespace)))
        inner = vars(namespace).get("m")
        if inspect.ismodule(inner):
            names.update(dir(inner))
    for name in sorted(n for n in names if not n.startswith("_") and n != "TYPE_CHECKING"):
        value = _read(namespace, name)
        if value is None or inspect.ismodule(value) or not _defined_in_torch(value):
            continue
        kind = "class" if inspect.isclass(value) else "function" if callable(value) else "attribute"
        yield Entry(f"{path}.{name}", kind, path, frozenset({"whole"}) | _reasons(name, value))


def _methods(path: str, cls: type, inherited: bool) -> Iterator[Entry]:
    """The public methods and attributes of ``cls`` in the surface (its own only, unless
    ``inherited``)."""
    names = dir(cls) if inherited else list(vars(cls))
    for name in sorted(names):
        if name.startswith("_"):
            continue
        try:
            value = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        function = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
        kind = "method" if callable(function) else "attribute"
        reasons = _reasons(name, function) if kind == "method" else _name_reasons(name)
        if reasons:
            yield Entry(f"{path}.{name}", kind, path, reasons)


# ---------------------------------------------------------------------------- reading signatures
def _reasons(name: str, value: Any) -> FrozenSet[str]:
    """Why ``value`` (found as ``name``) is in the surface: what its parameters take, and
    whether its name says CUDA."""
    found = set(_name_reasons(name))
    for parameter, annotation in parameters(value):
        for kind, pattern in PARAMETER_KINDS:
            if pattern.search(parameter):
                found.add(kind)
        for kind, word in ANNOTATION_KINDS:
            if word in annotation:
                found.add(kind)
    return frozenset(found)


def _name_reasons(name: str) -> FrozenSet[str]:
    return frozenset({"cuda_name"}) if CUDA_NAME.search(name) else frozenset()


def parameters(value: Any) -> List[Tuple[str, str]]:
    """(name, annotation text) of each parameter ``value`` takes: from ``inspect.signature``
    where Python can read one (for a class, its constructor's), else from the signatures its
    docstring spells (``zeros(*size, *, ..., device=None) -> Tensor``, pybind11's numbered
    overloads, ``.. method:: to(device=None, ...)``) and its ``__text_signature__``."""
    found: List[Tuple[str, str]] = []
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        found.extend((p.name, _annotation(p.annotation)) for p in signature.parameters.values())
    for text in _spelled_signatures(value):
        found.extend((match, "") for match in _PARAMETER.findall(text))
    return found


def _spelled_signatures(value: Any) -> Iterable[str]:
    """The argument lists a C++ binding's docstring (and its constructor's, for a class) and
    ``__text_signature__`` spell, each as the text inside the parentheses."""
    texts = []
    for holder in (value, _read(value, "__init__") if inspect.isclass(value) else None):
        if holder is None:
            continue
        text_signature = _read(holder, "__text_signature__")
        if isinstance(text_signature, str):
            texts.append(text_signature.strip()[1:-1])
        doc = _read(holder, "__doc__")
        if isinstance(doc, str):
            for line in doc.splitlines():
                if ">>>" in line:
                    continue
                match = _SIGNATURE_LINE.match(line)
                if match:
                    texts.append(match.group(2))
    return texts


def _read(value: Any, attr: str) -> Any:
    """``value.attr``, or None where reading it fails (``torch.backends.cuda.cufft_plan_cache``
    answers an unknown attribute by asking CUDA for its current device)."""
    try:
        return getattr(value, attr, None)
    except Exception:  # noqa: BLE001 - what reading raises is no part of the answer
        return None


def _annotation(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else repr(annotation)


# ---------------------------------------------------------------------------- plumbing
def _resolve(path: str) -> Optional[Any]:
    """The module or class at dotted ``path``, importing modules on the way; None when this
    torch has none (or cannot import it: a build without distributed support)."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attr in parts[split:]:
            found = getattr(found, attr, None)
            if found is None:
                return None
        return found
    return None


def _public(namespace: Any) -> List[Tuple[str, Any]]:
    """(name, value) of the public names of a module: its ``__all__`` and its other names
    without a leading underscore."""
    names = {n for n in getattr(namespace, "__all__", ()) if isinstance(n, str)}
    names.update(n for n in vars(namespace) if not n.startswith("_"))
    found = []
    for name in sorted(names):
        try:
            found.append((name, getattr(namespace, name)))
        except Exception:  # noqa: BLE001 - a listed name this build cannot give
            continue
    return found


def _defined_in_torch(value: Any) -> bool:
    """Whether ``value`` is torch's own (not ``typing.Any`` or a standard-library function a
    torch module imported); a plain value (a flag, a tuple) counts, a ``typing`` alias does not."""
    if inspect.isclass(value) or callable(value):
        module = _read(value, "__module__")
        if module is None:
            return inspect.isbuiltin(value)
    else:
        module = type(value).__module__
        if module == "builtins":
            return True
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


def _legacy_tensor_type(cls: type) -> bool:
    """Whether ``cls`` is a legacy tensor type (``torch.FloatTensor``): its methods are
    ``torch.Tensor``'s."""
    import torch

    return cls in getattr(torch, "_tensor_classes", ())


def _device_constructor_names() -> FrozenSet[str]:
    """The names of torch's own device constructors (the list ``with torch.device(...)``
    consults), as ``torch.<name>``."""
    try:
        from torch.utils._device import _device_constructors
    except ImportError:
        return frozenset()
    return frozenset(getattr(f, "__name__", "") for f in _device_constructors())
