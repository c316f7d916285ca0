"""The test modules run longest first, by the seconds the last run recorded: a run's record
merges into the file, and the next run reads the local record before the kept one."""

import json
from types import SimpleNamespace

from tests import durations


def test_a_run_merges_its_modules_seconds_into_the_record_longest_first(tmp_path, monkeypatch):
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"test_old": 50.0, "test_a": 1.0}))
    monkeypatch.setattr(durations, "_seconds", durations.collections.Counter())
    for nodeid, seconds in [("tests/test_a.py::one", 3.0), ("tests/test_a.py::two[x]", 4.0),
                            ("tests/test_b.py::three", 90.0)]:  # fmt: skip
        durations.add(SimpleNamespace(nodeid=nodeid, duration=seconds))
    durations.write(str(record))
    assert list(json.loads(record.read_text()).items()) == [
        ("test_b", 90.0), ("test_old", 50.0), ("test_a", 7.0)
    ]  # fmt: skip


def test_the_local_record_comes_before_the_kept_one(tmp_path, monkeypatch):
    kept, local = tmp_path / "kept.json", tmp_path / "local.json"
    kept.write_text(json.dumps({"test_a": 1.0}))
    monkeypatch.setattr(durations, "KEPT", kept)
    monkeypatch.setattr(durations, "LOCAL", local)
    assert durations.recorded() == {"test_a": 1.0}
    local.write_text(json.dumps({"test_a": 2.0}))
    assert durations.recorded() == {"test_a": 2.0}
