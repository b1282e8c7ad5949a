"""The package's data tables (``flagos_torchfl/data/``), read by path.

Reading them by path imports nothing (``importlib.resources.files`` would add its readers to every
activated process's modules); the package is installed as files, editable or from a wheel."""
from __future__ import annotations

import json
import os
from typing import Any, List

#: the folder of the tables
FOLDER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def read_json(name: str) -> Any:
    """The decoded JSON file ``name`` (``"chips/ascend.json"``) under :data:`FOLDER`."""
    with open(os.path.join(FOLDER, name), encoding="utf-8") as f:
        return json.load(f)


def names(folder: str) -> List[str]:
    """The names, without ``.json``, of the JSON files in ``folder`` under :data:`FOLDER`, sorted."""
    return sorted(n[:-5] for n in os.listdir(os.path.join(FOLDER, folder)) if n.endswith(".json"))
