"""docs/performance.md and docs/scaling.md are rendered from their templates
(benchmarks/*.md.in) and the recorded figures in benchmarks/results/*.jsonl; this test keeps
the pages and their sources the same.

Regenerate after recording a benchmark or editing the template: python benchmarks/report.py
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick

ROOT = Path(__file__).parent.parent
spec = importlib.util.spec_from_file_location("performance_report", ROOT / "benchmarks" / "report.py")
assert spec is not None and spec.loader is not None
report = importlib.util.module_from_spec(spec)
spec.loader.exec_module(report)


def test_the_pages_are_what_the_templates_and_the_results_render():
    for template, page in report.PAGES.items():
        rendered = report.render(template.read_text(), report.load())
        assert page.read_text() == rendered, f"docs/{page.name} is stale: python benchmarks/report.py"


def test_every_recorded_figure_says_when_where_and_by_which_command():
    for name, lines in report.load().items():
        for line in lines:
            missing = {"date", "machine", "command"} - set(line)
            assert not missing, f"benchmarks/results/{name}.jsonl: a line without {missing}"


def test_no_figure_is_transcribed_every_one_was_recorded_from_a_run():
    """Every figure on the page comes from a benchmark's run through record.py, with the
    commit it measured; none is copied from an older page."""
    for name, lines in report.load().items():
        for line in lines:
            assert "transcribed" not in json.dumps(line), f"benchmarks/results/{name}.jsonl: {line}"
            assert "commit" in line, f"benchmarks/results/{name}.jsonl: a line without its commit"


def test_a_placeholder_no_results_file_answers_is_an_error():
    recorded = {"core": [{"figure": "report_no_checkpoint", "ranks": 2, "median_ms": 0.17}]}
    rendered = report.render("{{core figure=report_no_checkpoint ranks=2 median_ms:.2f}} ms", recorded)
    assert rendered == "0.17 ms"
    for spec_text in ("{{core figure=report_no_checkpoint ranks=8 median_ms}}",
                      "{{core figure=report_no_checkpoint ranks=2 mean_ms}}",
                      "{{hashing algorithm=sha256 gb_per_s}}"):
        with pytest.raises(report.MissingFigure):
            report.render(spec_text, recorded)


def test_lines_that_disagree_are_not_a_figure():
    recorded = {"core": [{"ranks": 2, "median_ms": 0.17}, {"ranks": 4, "median_ms": 0.34}]}
    with pytest.raises(report.MissingFigure, match="disagree"):
        report.render("{{core median_ms}}", recorded)
    assert report.render("{{core ranks=4 median_ms*1000:.0f}} us", recorded) == "340 us"


def test_the_recorder_keeps_every_json_line_a_benchmark_or_its_ranks_print():
    spec_record = importlib.util.spec_from_file_location("performance_record",
                                                         ROOT / "benchmarks" / "record.py")
    assert spec_record is not None and spec_record.loader is not None
    record = importlib.util.module_from_spec(spec_record)
    spec_record.loader.exec_module(record)
    printed = ["starting", json.dumps({"figure": "a"}), "BENCH " + json.dumps({"figure": "b"}), "{broken"]
    assert record.figures(printed) == [{"figure": "a"}, {"figure": "b"}]
    assert record.results_name("benchmarks/core.py", ["--quick"]) == "core-quick"
    assert record.results_name("benchmarks/core.py", []) == "core"


def test_the_suite_time_stands_beside_the_calibration_recorded_on_its_machine():
    """README.md and docs/development.md give the suite's time with the figure a reader
    compares a machine by: benchmarks/calibrate.py's, as recorded."""
    recorded = report.load()["calibrate"]
    assert len(recorded) == 1, recorded
    cpu = f"{recorded[0]['linear_cpu_s']:.2f} s of CPU"
    for page in (ROOT / "README.md", ROOT / "docs" / "development.md"):
        text = " ".join(page.read_text().split())
        assert "benchmarks/calibrate.py" in text and cpu in text, f"{page.name} does not say {cpu}"
