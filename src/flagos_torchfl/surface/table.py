"""The classification table of the CUDA surface (``data/cuda_surface.json``) and its verdicts.

The table holds *entries* (exact names, written in groups that share a verdict) and *rules*
(a class of entries one mechanism covers: every operator with a ``Device`` argument, the names
of a namespace, torch's device constructors). An entry's verdict comes from its explicit entry
if it has one, else from the one rule that matches it; none, or more than one rule, leaves it
unclassified. A verdict record is ``{"verdict", "patch", "with" | "reason", "note"}``, with
``per_kind`` overrides for the backend kinds where the answer differs. One verdict is resolved
per backend: ``device_module`` (``torch.cuda`` names the facade does not serve itself) is
*answered* where the backend's device module has the name or its chip's counterpart, and
*refused* otherwise. A refusal on a sim profile names the chip's own counterpart where its
vendor's device module has one (``data/device_modules/<chip>.json``).
"""
from __future__ import annotations

import dataclasses
import fnmatch
import functools
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ..data_files import read_json
from .entries import Entry

VERDICTS = ("redirected", "answered", "passed", "refused")
#: the backend kinds a verdict is given for: the host, the sim, and the sim's chip profiles
KINDS = ("cpu", "sim", "ascend", "cambricon", "mthreads")
PROFILES = ("ascend", "cambricon", "mthreads")
_MATCH_KEYS = ("kind", "namespace", "glob", "tag", "last", "takes_no")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What a backend kind does with one entry: ``verdict`` (one of :data:`VERDICTS`), the
    ``patch`` of the redirection that does it, ``detail`` (what answers, or why it is refused),
    the chip's ``counterpart`` of a refused name, and ``source``: the table entry or rule."""

    verdict: str
    patch: Optional[str]
    detail: str
    counterpart: Optional[str]
    source: str

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclasses.dataclass(frozen=True)
class Row:
    """One entry and its verdict on a kind; ``problem`` says why it has none (unclassified)."""

    entry: Entry
    verdict: Optional[Verdict]
    problem: Optional[str] = None


class TableError(ValueError):
    """The table is malformed (a verdict, a kind or a match key it does not know)."""


class Table:
    """The loaded table: ``rules`` (id, match, record) and ``explicit`` (name -> (group, record))."""

    def __init__(self, data: Mapping[str, Any]):
        self.rules: List[Tuple[str, Dict[str, Any], Dict[str, Any]]] = []
        self.explicit: Dict[str, Tuple[str, Dict[str, Any]]] = {}
        for rule in data["rules"]:
            unknown = set(rule["match"]) - set(_MATCH_KEYS)
            if unknown:
                raise TableError(f"rule {rule['id']!r}: unknown match keys {sorted(unknown)}; "
                                 f"valid: {', '.join(_MATCH_KEYS)}")
            self.rules.append((rule["id"], rule["match"], _checked(rule["id"], rule)))
        for group in data["entries"]:
            record = _checked(group["id"], group)
            for name in group["names"]:
                if name in self.explicit:
                    raise TableError(f"{name!r} is listed in both {self.explicit[name][0]!r} and {group['id']!r}")
                self.explicit[name] = (group["id"], record)

    def source(self, entry: Entry) -> Tuple[Optional[Tuple[str, Dict[str, Any]]], Optional[str]]:
        """(source id, record) for ``entry``, or (None, why none)."""
        if entry.name in self.explicit:
            return self.explicit[entry.name], None
        matched = [(rule_id, record) for rule_id, match, record in self.rules if _matches(match, entry)]
        if len(matched) == 1:
            return matched[0], None
        if not matched:
            return None, "no rule or entry of the table covers it"
        return None, f"matched by several rules: {', '.join(r for r, _ in matched)}"

    def classify(self, entries: Iterable[Entry], kind: str) -> List[Row]:
        """Every entry with its verdict on backend ``kind`` (one of :data:`KINDS`)."""
        if kind not in KINDS:
            raise TableError(f"unknown backend kind {kind!r}; valid: {', '.join(KINDS)}")
        chip = _Chip.of(kind)
        rows = []
        for entry in entries:
            found, problem = self.source(entry)
            if found is None:
                rows.append(Row(entry, None, problem))
                continue
            source, record = found
            rows.append(Row(entry, chip.resolve(entry, source, _for_kind(record, kind))))
        return rows

    def patches(self) -> List[str]:
        """Every patch name the table gives, sorted."""
        records = [r for _, _, r in self.rules] + [r for _, r in self.explicit.values()]
        found = set()
        for record in records:
            for one in [record, *record.get("per_kind", {}).values()]:
                if one.get("patch"):
                    found.add(one["patch"])
        return sorted(found)


@functools.lru_cache(maxsize=None)
def load() -> Table:
    """The table shipped in ``data/cuda_surface.json``."""
    return Table(read_json("cuda_surface.json"))


def unclassified(rows: Iterable[Row]) -> List[Row]:
    """The rows without a verdict."""
    return [row for row in rows if row.verdict is None]


# ---------------------------------------------------------------------------- records
def _checked(owner: str, record: Mapping[str, Any]) -> Dict[str, Any]:
    """``record`` after checking its verdicts and kinds (TableError naming ``owner``)."""
    for kind, one in [(None, record), *record.get("per_kind", {}).items()]:
        if kind is not None and kind not in KINDS + ("profile",):
            raise TableError(f"{owner!r}: unknown backend kind {kind!r}; valid: {', '.join(KINDS)}, profile")
        if one["verdict"] not in VERDICTS + ("device_module",):
            raise TableError(f"{owner!r}: unknown verdict {one['verdict']!r}; valid: {', '.join(VERDICTS)}, "
                             "device_module")
    return dict(record)


def _for_kind(record: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    """The record for ``kind``: its own override, a profile's ``profile`` then ``sim`` override
    (a profile is the sim with a chip's name), else the record itself."""
    overrides = record.get("per_kind", {})
    chain = [kind, "profile", "sim"] if kind in PROFILES else [kind]
    for key in chain:
        if key in overrides:
            return overrides[key]
    return record


def _matches(match: Mapping[str, Any], entry: Entry) -> bool:
    checks = {
        "kind": lambda v: entry.kind == v,
        "namespace": lambda v: entry.namespace == v,
        "glob": lambda v: fnmatch.fnmatchcase(entry.name, v),
        "tag": lambda v: v in entry.tags,
        "last": lambda v: entry.name.rpartition(".")[2] in v,
        "takes_no": lambda v: not entry.reasons & set(v),
    }
    return all(checks[key](value) for key, value in match.items())


# ---------------------------------------------------------------------------- the chip of a kind
class _Chip:
    """What a backend kind's device module offers and what its chip calls CUDA's names."""

    def __init__(self, kind: str, device_type: str, module_names: frozenset, module_label: str,
                 counterparts: Mapping[str, str], table: Any):
        self.kind, self.device_type = kind, device_type
        self.module_names, self.module_label = module_names, module_label
        self.counterparts, self.table = counterparts, table

    @staticmethod
    @functools.lru_cache(maxsize=None)
    def of(kind: str) -> "_Chip":
        from ..backends import get_backend, registry

        if kind == "cpu":
            from ..machine.host import HostRuntime

            names = frozenset(n for n in dir(HostRuntime) if not n.startswith("_"))
            return _Chip(kind, "cpu", names, "the host runtime", {}, None)
        from ..sim.runtime import device as sim_module

        backend = registry().profile(kind) if kind in PROFILES else get_backend(kind)
        return _Chip(kind, backend.device_type, frozenset(sim_module.__all__),
                     f"the sim's torch.{backend.device_type}", dict(backend.cuda_counterparts),
                     backend.device_module_table())

    def resolve(self, entry: Entry, source: str, record: Mapping[str, Any]) -> Verdict:
        """The verdict of ``record`` for ``entry`` on this kind (``device_module`` resolved)."""
        verdict = record["verdict"]
        detail = record.get("with") or record.get("reason") or ""
        name = entry.name.rpartition(".")[2]
        if verdict == "device_module":
            own = next((n for n in (name, self.counterparts.get(name)) if n in self.module_names), None)
            if own is not None:
                verdict, detail = "answered", f"{self.module_label}.{own}"
            else:
                verdict, detail = "refused", f"{self.module_label} has no {name}: an unserved stand-in, raising on use"
        if record.get("note"):
            detail = f"{detail} ({record['note']})" if detail else record["note"]
        counterpart = self.counterpart(name) if verdict == "refused" else None
        return Verdict(verdict, record.get("patch"), detail, counterpart, source)

    def counterpart(self, name: str) -> Optional[str]:
        """The chip's own name for CUDA's ``name`` in its vendor's device module, where it has
        one (a sim profile's chip only)."""
        if self.table is None:
            return None
        for own in (self.counterparts.get(name), name):
            if own and own in self.table.names:
                return f"{self.table.device_module}.{own}"
        return None
