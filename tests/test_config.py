"""Every setting is validated in one place, with errors that name the problem and the valid forms."""
import pytest

from flagos_torchfl import config
from flagos_torchfl.config import MemoryLimit
from flagos_torchfl.errors import ConfigError

MIB, GIB = 1 << 20, 1 << 30


@pytest.mark.parametrize("raw, expected", [
    (None, None),
    (MIB, MemoryLimit(bytes=MIB)),
    (0.5, MemoryLimit(fraction=0.5)),
    (1.0, MemoryLimit(fraction=1.0)),
    ("40GiB", MemoryLimit(bytes=40 * GIB)),
    ("512MB", MemoryLimit(bytes=512 * 10**6)),
    ("1.5 GiB", MemoryLimit(bytes=int(1.5 * GIB))),
    ("2097152", MemoryLimit(bytes=2 * MIB)),
    ("0.25", MemoryLimit(fraction=0.25)),
    ("50%", MemoryLimit(fraction=0.5)),
    ("8kib", None),  # below 1 MiB: error, checked below
])
def test_memory_limit_forms(raw, expected):
    if raw == "8kib":
        with pytest.raises(ConfigError, match="below the minimum of 1 MiB"):
            config.parse_memory_limit(raw)
    else:
        assert config.parse_memory_limit(raw) == expected


@pytest.mark.parametrize("raw, message", [
    (1000, "below the minimum of 1 MiB"),
    (0.0, r"not a fraction in \(0, 1\]"),
    (1.5, r"not a fraction in \(0, 1\]"),
    (-0.1, r"not a fraction in \(0, 1\]"),
    ("40 parsecs", "malformed"),
    ("GiB", "malformed"),
    (True, "not valid"),
    ([1], "has type list"),
])
def test_memory_limit_rejects(raw, message):
    with pytest.raises(ConfigError, match=message) as info:
        config.parse_memory_limit(raw)
    assert "40GiB" in str(info.value)  # the valid forms are always named


def test_memory_limit_resolves_fraction_against_device_memory():
    assert MemoryLimit(fraction=0.5).resolve(8 * GIB) == 4 * GIB
    assert MemoryLimit(bytes=3 * GIB).resolve(8 * GIB) == 3 * GIB
    assert MemoryLimit(fraction=0.5).resolve(None) is None


@pytest.mark.parametrize("raw, expected", [(None, None), (1, 1), (50, 50), ("7", 7)])
def test_clear_interval_accepts(raw, expected):
    assert config.parse_clear_interval(raw) == expected


@pytest.mark.parametrize("raw", [0, -3, 2.5, "ten", True, "1.0"])
def test_clear_interval_rejects(raw):
    with pytest.raises(ConfigError, match="positive int"):
        config.parse_clear_interval(raw)


@pytest.mark.parametrize("raw, expected", [
    ([0, 1, 2, 3], (0, 1, 2, 3)), ((2,), (2,)), ("1,0", (1, 0)), (3, (3,)), (range(2), (0, 1)),
])
def test_gpu_ids_accepts(raw, expected):
    assert config.parse_gpu_ids(raw, device_count=4) == expected


@pytest.mark.parametrize("raw, message", [
    ([], "empty"),
    ([0, 0], r"more than once"),
    ([0, "1"], "must hold integers"),
    ([0.0], "must hold integers"),
    ([True], "must hold integers"),
    ([4], r"out of range; the backend has 4 device\(s\), valid indices 0..3"),
    ([-1], "out of range"),
    ("a,b", "comma-separated list of integers"),
    ({0: 1}, "list of device indices"),
])
def test_gpu_ids_rejects(raw, message):
    with pytest.raises(ConfigError, match=message):
        config.parse_gpu_ids(raw, device_count=4)


def test_bools():
    assert config.parse_bool("x", "on") is True and config.parse_bool("x", "0") is False
    with pytest.raises(ConfigError, match="True/False"):
        config.parse_bool("enable_mixed_precision", "maybe")


def test_unknown_setting_suggests_the_closest():
    with pytest.raises(ConfigError, match="Did you mean 'memory_pool_clear_interval'"):
        config.settings_from({"memory_pool_clear_intervall": 3})
