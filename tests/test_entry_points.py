"""Entry points are read once per import path: a distribution put on ``sys.path`` later is seen."""
from flagos_torchfl import entry_points

DIST = """Metadata-Version: 2.1
Name: late-plugin
Version: 1.0
"""


def test_a_distribution_added_to_the_import_path_is_seen_by_the_next_scan(tmp_path, monkeypatch):
    group = "flagos_torchfl.test_entry_points"
    assert entry_points.group_entry_points(group) == []
    info = tmp_path / "late_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(DIST)
    (info / "entry_points.txt").write_text(f"[{group}]\nlate = json:dumps\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert [ep.name for ep in entry_points.group_entry_points(group)] == ["late"]
    loaded = []
    assert entry_points.load_entry_points(group, loaded.append) == {}
    import json
    assert loaded == [json.dumps]
