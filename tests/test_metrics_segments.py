"""metrics.jsonl where storage cannot append: the log in segments on the real S3 server, each
report replacing only the last segment, read back whole and in order, taken back and cut on
resume; on a filesystem, one file appended to. Rank 0 holds no more than the last segment."""

from __future__ import annotations

import json

import pytest

from hpckit.experiment import metrics, reading
from hpckit.experiment.metrics import MetricsLog
from hpckit.experiment.reading import read_last_metrics, read_metrics
from hpckit.storage import files
from hpckit.storage.location import resolve


@pytest.fixture
def small_segments(monkeypatch):
    """Segments of three lines, and every object the log writes, with its lines."""
    monkeypatch.setattr(reading, "SEGMENT_LINES", 3)
    monkeypatch.setattr(metrics, "SEGMENT_LINES", 3)
    written: list[tuple[str, int]] = []
    real = files.write_atomic

    def counted(location, data: bytes) -> None:
        written.append((location.name, data.count(b"\n")))
        real(location, data)

    monkeypatch.setattr(files, "write_atomic", counted)
    return written


def steps(experiment) -> list[int]:
    return [entry["step"] for entry in read_metrics(experiment)]


def test_on_s3_each_report_replaces_only_the_last_segment(s3, small_segments):
    experiment = resolve(s3.uri("segments/exp"))
    log = MetricsLog(experiment, 0, [])
    for step in range(8):
        log.append(step, {"loss": 1 / (step + 1)}, None)
    assert small_segments == [("metrics.jsonl", n) for n in (1, 2, 3)] + \
        [("metrics.000001.jsonl", n) for n in (1, 2, 3)] + \
        [("metrics.000002.jsonl", n) for n in (1, 2)], "a full segment is never written again"
    assert steps(experiment) == list(range(8)) and read_last_metrics(experiment)["step"] == 7
    assert len(log.tail) == 2 and log.history() == read_metrics(experiment)
    before = len(small_segments)
    log.retract()
    log.retract()  # the last segment's last line: the segment goes, the one before is the tail
    assert steps(experiment) == list(range(6)) and len(log.tail) == 3
    assert [p.name for p in reading.segments(experiment)] == ["metrics.jsonl",
                                                               "metrics.000001.jsonl"]
    log.append(6, {"loss": 0.1}, "checkpoint_000000")
    assert steps(experiment) == list(range(7)) and small_segments[-1] == ("metrics.000002.jsonl", 1)
    resumed = MetricsLog.resume(experiment, 4, None)
    assert "metrics.jsonl" not in [name for name, _ in small_segments[before:]], \
        "taking lines back and resuming rewrite only the segments that change"
    assert steps(experiment) == [0, 1, 2, 3] and resumed.count == 4 and len(resumed.tail) == 1
    assert [p.name for p in reading.segments(experiment)] == ["metrics.jsonl",
                                                               "metrics.000001.jsonl"]


def test_on_a_filesystem_the_log_is_one_file_appended_to(tmp_path, small_segments):
    experiment = resolve(str(tmp_path))
    log = MetricsLog(experiment, 0, [])
    for step in range(5):
        log.append(step, {"loss": 1.0}, None)
    assert small_segments == [] and log.tail == [], "appended, not rewritten, nothing held"
    assert [json.loads(line)["step"] for line in
            (tmp_path / "metrics.jsonl").read_text().splitlines()] == list(range(5))
    log.retract()
    assert steps(experiment) == list(range(4)) and log.count == 4
    assert not (tmp_path / "metrics.000001.jsonl").exists()


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_resume_that_drops_every_line_leaves_an_empty_log(where, tmp_path, request):
    """Nothing committed yet: every line describes work being redone, on either storage."""
    experiment = (resolve(request.getfixturevalue("s3").uri("segments/empty")) if where == "s3"
                  else resolve(str(tmp_path)))
    log = MetricsLog(experiment, 0, [])
    for step in range(3):
        log.append(step, {"loss": 1.0}, None)
    resumed = MetricsLog.resume(experiment, 0, None)
    assert steps(experiment) == [] and resumed.count == 0 and resumed.tail == []
    resumed.append(0, {"loss": 0.5}, None)
    assert steps(experiment) == [0]
