"""User text written as text by every command and file that carries it (schema/text.py, one helper a sink):
a study and variants named like Rich markup and a spreadsheet formula, a claim holding an escape sequence,
through `ablate sweep`, `status`, `report`, `compare` (terminal and --markdown), report.md and results.csv."""

from __future__ import annotations

import csv
import shutil

import pytest
from test_sweep import write_study

from ablate.schema.text import csv_cell, shown
from tests.conftest import ablate

NAME = "[/]x [bold]y"
VARIANTS = {"[/]": {"preset": "transformer"}, '=HYPERLINK("http://x","y")': {"preset": "lstm"}}
CLAIM = "The \x1b[31mred\x1b[0m claim [link=http://x]here[/link]"
ESC = "\x1b"


def test_each_sink_writes_user_text_as_text():
    assert shown("a\x1b[31mb\rc\nd\te") == "a\\x1b[31mb\\rc\nd\te"
    assert shown("[/]x") == "[/]x"
    assert [csv_cell(v) for v in ("=1+1", "+1", "-x", "@SUM(A1)", "\tx", "plain", -1.5, 3)] == [
        "'=1+1", "'+1", "'-x", "'@SUM(A1)", "'\tx", "plain", -1.5, 3,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile-names")
    claim = {"text": CLAIM, "compare": {"model.arch": "lstm"}, "to": {"model.arch": "transformer"},
             "metric": "test/tok_acc", "expect": "lower", "margin": 0.0}  # fmt: skip
    study = write_study(tmp / "study.yaml", name=NAME, variants=VARIANTS, claims=[claim])
    out = tmp / "runs"
    proc = ablate("sweep", str(study), "--out", str(out), "--wandb", "disabled", "--workers", "1")
    return tmp, study, out, proc


def assert_plain(proc, *texts):
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and ESC not in proc.stdout + proc.stderr
    for text in texts:
        assert text in proc.stdout


def test_sweep_status_and_report_print_the_names_as_they_read(swept):
    tmp, study, out, proc = swept
    assert_plain(proc, NAME)
    assert_plain(ablate("status", str(study), "--out", str(out)), NAME, "[/]")
    report = ablate("report", str(study), "--out", str(out))
    assert_plain(report)
    assert "report built" in report.stderr


def test_compare_prints_and_writes_the_names_as_they_read(swept):
    tmp, study, out, _ = swept
    rerun = tmp / "rerun"  # one run twice is refused: a copy stands for its re-run
    shutil.copytree(out, rerun, dirs_exist_ok=True)
    markdown = tmp / "compare.md"
    proc = ablate("compare", str(study), str(study), "--out", str(out), "--out", str(rerun), "--markdown", str(markdown))
    assert_plain(proc, "[/]")  # the claim folds across the table's lines; no ESC anywhere (assert_plain)
    assert ESC not in markdown.read_text() and "\\x1b[31mred" in markdown.read_text()


def test_report_files_hold_no_escape_and_no_formula(swept):
    _, _, out, _ = swept
    folders = [p for p in out.iterdir() if (p / "report").is_dir()]
    assert len(folders) == 1
    report = folders[0] / "report"
    assert ESC not in (report / "report.md").read_text() and ESC not in (report / "report.html").read_text()
    with (report / "results.csv").open() as f:
        variants = {row["variant"] for row in csv.DictReader(f)}
    assert variants == {"[/]", "'" + '=HYPERLINK("http://x","y")'}
