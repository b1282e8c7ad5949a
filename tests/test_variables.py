"""The settings table: every FL_* variable declared once, read through it, documented from it."""
from __future__ import annotations

import re

import pytest

from flagos_torchfl import variables
from flagos_torchfl.errors import ConfigError
from tests.helpers import ROOT

SRC = ROOT / "src" / "flagos_torchfl"
BOOTSTRAP = SRC / "bootstrap" / "sitecustomize.py"
#: run before torch and the package can be imported (the start-up hook loads the second by path)
BEFORE_TORCH = (BOOTSTRAP, SRC / "autoload.py")


def sources():
    return {p: p.read_text(encoding="utf-8") for p in SRC.rglob("*.py")}


def test_each_variable_is_declared_exactly_once():
    declared = re.findall(r'Variable\("(FL_[A-Z0-9_]+)"', (SRC / "variables.py").read_text())
    assert len(declared) == len(set(declared)) == len(variables.VARIABLES)
    for path, text in sources().items():
        if path.name != "variables.py":
            assert 'Variable("FL_' not in text, path


def test_no_module_reads_or_writes_a_variable_around_the_table():
    access = re.compile(r'(environ|getenv)\s*(\.get\(|\[|\()\s*["\']FL_')
    offenders = [str(p.relative_to(SRC)) for p, text in sources().items()
                 if access.search(text) and p not in BEFORE_TORCH]
    assert offenders == []


@pytest.mark.parametrize("path", BEFORE_TORCH, ids=lambda p: p.name)
def test_the_modules_that_run_before_torch_use_declared_names_only(path):
    # they run before torch and this package can be imported: they spell their names
    used = set(re.findall(r'["\'](FL_[A-Z0-9_]+)["\']', path.read_text()))
    assert used and used <= set(variables.VARIABLES)


def test_every_literal_variable_name_in_the_package_is_declared():
    used = set()
    for text in sources().values():
        used.update(re.findall(r"\b(FL_[A-Z][A-Z0-9_]*[A-Z0-9])\b", text))
    assert used - set(variables.VARIABLES) == set()


def test_readme_table_is_the_table():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert variables.markdown_table() in readme


@pytest.mark.parametrize("name, text, message", [
    ("FL_PROBE_TIMEOUT", "inf", "FL_PROBE_TIMEOUT='inf' is not valid"),
    ("FL_PROBE_TIMEOUT", "1e300", "number in"),
    ("FL_PROBE_TIMEOUT", "-1", "FL_PROBE_TIMEOUT"),
    ("FL_SIM_DEVICES", "129", "from 1 to 128"),
    ("FL_CPU_DEVICES", "٣", "FL_CPU_DEVICES"),
    ("FL_LOG_LEVEL", "bogus", "invalid FL_LOG_LEVEL 'bogus'. Valid levels: DEBUG"),
    ("FL_ROUTING_REGISTRATION", "perop", "Did you mean 'per-op'"),
])
def test_bad_values_name_the_variable_and_the_valid_forms(name, text, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        variables.read(name, {name: text})


def test_defaults_and_unknown_names():
    assert variables.read("FL_PROBE_TIMEOUT", {}) == 10.0
    assert variables.read("FL_PROBE_TIMEOUT", {"FL_PROBE_TIMEOUT": " 2.5 "}) == 2.5
    assert variables.read("FL_SIM_DEVICES", {"FL_SIM_DEVICES": "128"}) == 128
    with pytest.raises(ConfigError, match="Did you mean 'FL_BACKEND'"):
        variables.read("FL_BACKNED")


def test_a_renamed_value_is_read_as_its_new_name_with_a_warning():
    with pytest.warns(FutureWarning, match="FL_SIM_RUNTIME=native is deprecated: say FL_SIM_RUNTIME=cpp"):
        assert variables.read("FL_SIM_RUNTIME", {"FL_SIM_RUNTIME": "native"}) == "cpp"
    with pytest.raises(ConfigError, match="Did you mean 'cpp'"):
        variables.read("FL_SIM_RUNTIME", {"FL_SIM_RUNTIME": "cppp"})
