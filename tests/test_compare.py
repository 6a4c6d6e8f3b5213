"""`ablate compare` and its API: two stored runs side by side. The studies are stored as a sweep leaves them
(prepare_study, then each queued trial told its metric as a worker would), with metrics written by hand, so
nothing trains; every number printed is checked against the trial tables by hand: means and CIs from
analysis/stats.py, verdicts from analysis/claims.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from conftest import ablate
from optuna.trial import TrialState
from typer.testing import CliRunner

import ablate as api
from ablate.analysis import claims, stats
from ablate.analysis.compare import Run, compare
from ablate.cli import app
from ablate.harness import compat
from ablate.harness.artifacts import default_storage_url
from ablate.harness.study.queue import load_phase_study, prepare_study
from ablate.harness.study.storage import open_storage
from ablate.reports.compare import claim_table, interval
from ablate.reports.formats import md_cell, number
from ablate.schema.metric_registry import metric_range
from ablate.schema.spec import StudySpec
from ablate.schema.trials import EVAL, trial_seed

optuna.logging.set_verbosity(optuna.logging.WARNING)

METRIC, EXAMPLES = "test/tok_acc", 200
VARIANTS = {
    "pos": {"preset": "transformer", "model.pos_encoding": "sinusoidal"},
    "nopos": {"preset": "transformer", "model.pos_encoding": "none"},
    "lstm": {"preset": "lstm"},
    "lstm-bahdanau": {"preset": "lstm-bahdanau"},
}
NO_POSITIONS = {"text": "Without positions a Transformer cannot reverse.", "compare": {"model.pos_encoding": "none"},
                "to": {"model.pos_encoding": "sinusoidal"}, "expect": "lower", "margin": 0.3}  # fmt: skip
# Its positive control (positions removed, which reversal needs) lets its agreement stand where it agrees.
LSTM_LIKE = {"text": "An LSTM reverses as well as a Transformer.", "compare": {"preset": "lstm"},
             "to": {"model.pos_encoding": "sinusoidal"}, "expect": "similar", "margin": 0.05,
             "control": {"compare": {"model.pos_encoding": "none"}, "to": {"model.pos_encoding": "sinusoidal"}}}  # fmt: skip
ATTENTION = {"text": "An LSTM with attention trails the Transformer [a | b].", "compare": {"preset": "lstm-bahdanau"},
             "to": {"model.pos_encoding": "sinusoidal"}, "expect": "lower", "margin": 0.02}  # fmt: skip
SIDES = {NO_POSITIONS["text"]: ("nopos", "pos"), LSTM_LIKE["text"]: ("lstm", "pos"),
         ATTENTION["text"]: ("lstm-bahdanau", "pos")}  # fmt: skip
# Each variant's test/tok_acc by seed; None: the trial failed. The re-run (fresh seeds) brings the LSTM
# level with the Transformer: its claim goes from contradicted to reproduced, the other claim stays.
FIRST = {"pos": [0.95, 0.93, 0.96], "nopos": [0.30, 0.35, 0.28], "lstm": [0.80, 0.76, 0.82]}
RERUN = {"pos": [0.94, 0.95, 0.96], "nopos": [0.31, 0.29, 0.33], "lstm": [0.95, 0.96, None]}
# Another study sharing one claim and two variants, with a claim and a variant of its own.
OTHER = {"pos": [0.97, 0.96, 0.98], "nopos": [0.20, 0.25, 0.22], "lstm-bahdanau": [0.90, 0.92, 0.91]}


def tree(name: str, values: dict, claim_list: list[dict], start: int = 0) -> dict:
    """A study file of the variants in `values`, seeds `start` to `start` + 2."""
    return {"name": name, "base": {"task": {"name": "reverse", "max_len": 5}},
            "variants": {v: VARIANTS[v] for v in values}, "seeds": list(range(start, start + 3)),
            "metric": {"name": METRIC}, "claims": claim_list}  # fmt: skip


def store(runs: Path, name: str, values: dict, claim_list: list[dict], start: int = 0) -> StudySpec:
    """The study `tree` makes, stored under `runs` with each trial complete (or failed), as a sweep leaves it."""
    spec = StudySpec.model_validate(tree(name, values, claim_list, start))
    storage = open_storage(default_storage_url(spec.slug, runs))
    prepare_study(spec, storage)
    study = load_phase_study(spec, storage, EVAL)
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        assert storage.set_trial_state_values(compat.trial_id(frozen), TrialState.RUNNING)
        trial = optuna.Trial(study, compat.trial_id(frozen))
        variant = trial.suggest_categorical("variant", list(spec.variant_overrides()))
        value = values[variant][spec.seed_pool.index(trial_seed(frozen))]
        if value is None:
            study.tell(trial, state=TrialState.FAIL)
            continue
        trial.set_user_attr("metrics", {METRIC: value})
        trial.set_user_attr("split_sizes", {"test": EXAMPLES})
        study.tell(trial, value)
    return spec


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """`rev` in first/ and its re-run on seeds 100-102 in rerun/; `rev-other`, another study, in first/."""
    root = tmp_path_factory.mktemp("compare")
    store(root / "first", "rev", FIRST, [NO_POSITIONS, LSTM_LIKE])
    store(root / "rerun", "rev", RERUN, [NO_POSITIONS, LSTM_LIKE], start=100)
    store(root / "first", "rev-other", OTHER, [ATTENTION, NO_POSITIONS])
    return root


def finite(values: list) -> np.ndarray:
    return np.array([v for v in values if v is not None])


def by_hand(values: dict, claim: dict) -> dict:
    """A claim of one compare and one to variant judged from its seeds: Δ and its CI (stats.diff_ci, as
    claims pools a side), the verdict (claims.verdict) and the seeds a side."""
    a, b = (finite(values[variant]) for variant in SIDES[claim["text"]])
    diff, lo, hi = stats.diff_ci([(a, b)], metric_range(METRIC), EXAMPLES)
    return {"verdict": claims.verdict(lo, hi, claim["expect"], claim["margin"]), "diff": diff, "ci_low": lo,
            "ci_high": hi, "n_compare": len(a), "n_to": len(b)}  # fmt: skip


def mean_by_hand(values: list) -> dict:
    v = finite(values)
    lo, hi = stats.mean_ci(v, metric_range(METRIC), EXAMPLES)
    return {"mean": v.mean(), "ci_low": lo, "ci_high": hi, "seeds": len(v)}


def invoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["compare", *args], env={"COLUMNS": "250", **(env or {})})


def test_each_claims_verdicts_deltas_and_seeds_and_each_variants_means_are_the_trial_tables(runs):
    result = invoke("rev", "rev", "--out", str(runs / "first"), "--out", str(runs / "rerun"), "--json")
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert [r["label"] for r in got["runs"]] == ["rev (1)", "rev (2)"] and got["metric"] == METRIC
    assert [r["storage"] for r in got["runs"]] == [
        default_storage_url("rev", runs / d) for d in ("first", "rerun")
    ]
    assert [c["text"] for c in got["claims"]] == [NO_POSITIONS["text"], LSTM_LIKE["text"]]
    for row, claim in zip(got["claims"], (NO_POSITIONS, LSTM_LIKE)):
        for run, values in zip(row["runs"], (FIRST, RERUN)):
            expected = by_hand(values, claim)
            assert run["verdict"] == expected["verdict"]
            assert (run["n_compare"], run["n_to"]) == (expected["n_compare"], expected["n_to"])
            for key in ("diff", "ci_low", "ci_high"):
                assert run[key] == pytest.approx(expected[key], abs=1e-12), key
            assert (run["expect"], run["margin"], run["level"]) == (claim["expect"], claim["margin"], 0.95)
        assert row["in"] == ["rev (1)", "rev (2)"]
    positions, lstm = got["claims"]
    # The data were made for these: one verdict kept, one changed (the failed seed leaves the LSTM two).
    assert [r["verdict"] for r in positions["runs"]] == ["reproduced", "reproduced"]
    assert positions["changed"] is False
    assert [r["verdict"] for r in lstm["runs"]] == ["contradicted", "reproduced"] and lstm["changed"] is True
    assert lstm["runs"][1]["n_compare"] == 2
    assert [v["variant"] for v in got["variants"]] == ["pos", "nopos", "lstm"]
    for row in got["variants"]:
        for run, values in zip(row["runs"], (FIRST, RERUN)):
            expected = mean_by_hand(values[row["variant"]])
            assert run["seeds"] == expected["seeds"]
            for key in ("mean", "ci_low", "ci_high"):
                assert run[key] == pytest.approx(expected[key], abs=1e-12), key


def test_a_ci_says_its_level_where_it_is_not_95_percent():
    assert interval(-0.5, -0.7, -0.3) == "-0.500 [-0.700, -0.300]"
    assert interval(-0.5, -0.7, -0.3, 1 - 0.05 / 3) == "-0.500 [-0.700, -0.300] (98.3%)"  # three looks
    assert interval(0.25, 0.1, 0.4, 0.99) == "0.250 [0.100, 0.400] (99%)"
    assert interval(float("nan"), float("nan"), float("nan")) == "–"
    assert interval(0.25, float("nan"), float("nan")) == "0.250 [–, –]"  # one seed: no interval


def frame(values: dict) -> pd.DataFrame:
    """A trial table as analysis/table.py makes it, of completed trials only."""
    cells = [(variant, seed, x) for variant, xs in values.items() for seed, x in enumerate(xs)]
    rows = [{"trial": i, "variant": variant, "seed": seed, "state": "COMPLETE", METRIC: x, "examples/test": EXAMPLES}
            for i, (variant, seed, x) in enumerate(cells)]  # fmt: skip
    return pd.DataFrame(rows)


def test_claims_of_one_text_pair_in_order_and_a_changed_margin_shows_both():
    """Without a storage: analysis/compare.py on two trial tables. A study may state one text twice (two
    margins); the second run moved the first claim's margin."""
    strict = {**NO_POSITIONS, "margin": 0.65}
    first = StudySpec.model_validate(tree("rev", FIRST, [NO_POSITIONS, strict]))
    second = StudySpec.model_validate(tree("rev", FIRST, [strict, strict]))
    c = compare(Run(first, "a", frame(FIRST)), Run(second, "b", frame(FIRST)))
    assert [row.text for row in c.claims] == [NO_POSITIONS["text"]] * 2
    assert [[r.claim.margin for r in row.results] for row in c.claims] == [[0.3, 0.65], [0.65, 0.65]]
    # Δ -0.637 [-0.692, -0.571]: below -0.3, not below -0.65.
    assert [row.changed for row in c.claims] == [True, False]
    _, rows = claim_table(c)
    assert [(row[5], row[-1]) for row in rows] == [("lower 0.3 / lower 0.65", "yes"), ("lower 0.65", "no")]


def md_rows(text: str, first_cell: str) -> list[list[str]]:
    rows = [line.strip("|").split(" | ") for line in text.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row] for row in rows if row[0].strip() == first_cell]


def test_markdown_and_the_terminal_show_the_same_cells_and_the_markdown_is_all_that_is_written(
    runs, tmp_path
):
    out = tmp_path / "compare.md"
    args = ("rev", "rev", "--out", str(runs / "first"), "--out", str(runs / "rerun"))
    result = invoke(*args, "--markdown", str(out))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compare.md"]  # no temporary file left beside it
    text = out.read_text()
    assert text.count("| claim | rev (1) verdict | rev (2) verdict |") == 1
    ((lstm),) = md_rows(text, LSTM_LIKE["text"])
    first, rerun = by_hand(FIRST, LSTM_LIKE), by_hand(RERUN, LSTM_LIKE)
    delta = [f"{number(r['diff'])} [{number(r['ci_low'])}, {number(r['ci_high'])}]" for r in (first, rerun)]
    assert lstm == [LSTM_LIKE["text"], "contradicted", "reproduced", *delta, "similar 0.05", "3 vs 3", "2 vs 3",
                    "yes"]  # fmt: skip
    ((positions),) = md_rows(text, NO_POSITIONS["text"])
    assert positions[1:3] == ["reproduced", "reproduced"] and positions[-1] == "no"
    ((lstm_means),) = md_rows(text, "lstm")
    means = [mean_by_hand(v["lstm"]) for v in (FIRST, RERUN)]
    assert lstm_means == ["lstm", *(cell for m in means for cell in (
        f"{number(m['mean'])} [{number(m['ci_low'])}, {number(m['ci_high'])}]", str(m["seeds"]))), "both"]  # fmt: skip
    # The terminal's tables hold the same cells (rich may wrap the claim's text, not the numbers).
    for cell in [*delta, "contradicted", *lstm_means[1:4]]:
        assert cell in result.stdout, cell


def test_two_studies_are_compared_on_what_they_share_and_list_what_only_one_has(runs, tmp_path):
    out = tmp_path / "compare.md"
    result = invoke("rev", "rev-other", "--out", str(runs / "first"), "--json", "--markdown", str(out))
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert [r["label"] for r in got["runs"]] == ["rev", "rev-other"]
    rows = {c["text"]: c for c in got["claims"]}
    assert list(rows) == [NO_POSITIONS["text"], LSTM_LIKE["text"], ATTENTION["text"]]
    shared, first_only, second_only = rows.values()
    assert shared["in"] == ["rev", "rev-other"] and shared["changed"] is False
    assert [r["diff"] for r in shared["runs"]] == pytest.approx(
        [by_hand(FIRST, NO_POSITIONS)["diff"], by_hand(OTHER, NO_POSITIONS)["diff"]]
    )
    assert first_only["in"] == ["rev"] and first_only["runs"][1] is None and first_only["changed"] is None
    assert second_only["in"] == ["rev-other"] and second_only["runs"][0] is None
    assert second_only["runs"][1]["verdict"] == by_hand(OTHER, ATTENTION)["verdict"]
    variants = {v["variant"]: v["in"] for v in got["variants"]}
    assert variants == {"pos": ["rev", "rev-other"], "nopos": ["rev", "rev-other"], "lstm": ["rev"],
                        "lstm-bahdanau": ["rev-other"]}  # fmt: skip
    text = out.read_text()
    assert md_rows(text, LSTM_LIKE["text"])[0][-1] == "only in rev"
    assert md_rows(text, md_cell(ATTENTION["text"]))[0][-1] == "only in rev-other"  # its pipe escaped
    assert "[a | b]" in invoke("rev", "rev-other", "--out", str(runs / "first")).stdout  # text, not markup
    assert md_rows(text, "lstm")[0][-3:] == ["–", "–", "only in rev"]


def test_the_api_compares_as_the_command_does(runs, tmp_path):
    cli = json.loads(
        invoke("rev", "rev", "--out", str(runs / "first"), "--out", str(runs / "rerun"), "--json").stdout
    )
    comparison = api.compare("rev", "rev", out=(runs / "first", runs / "rerun"))
    assert [row.changed for row in comparison.claims] == [c["changed"] for c in cli["claims"]]
    assert [r.diff for r in comparison.claims[1].results] == [r["diff"] for r in cli["claims"][1]["runs"]]
    assert comparison.variants[2].means[1].seeds == 2
    # Study.compare: a study file's runs beside another Study's, or a study stored beside it by name.
    study_file = tmp_path / "rev.yaml"
    study_file.write_text(yaml.safe_dump(tree("rev", FIRST, [NO_POSITIONS, LSTM_LIKE])))
    first = api.load_study(study_file, out=runs / "first")
    rerun = api.load_study(study_file, out=runs / "rerun")
    assert [row.changed for row in first.compare(rerun).claims] == [False, True]
    assert [row.text for row in first.compare("rev-other").claims][-1] == ATTENTION["text"]
    with pytest.raises(api.ConfigError, match="one run"):
        first.compare(first)


def files(root: Path) -> set[Path]:
    """Every file and folder under `root`, but SQLite's write-ahead log and its index, which SQLite itself
    removes when the last connection to a database closes."""
    return {p for p in root.rglob("*") if not p.name.endswith(("-wal", "-shm"))}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["rev", "nothing-here", "--out", "{first}"], "no such database"),
        (["rev", "rev", "--storage", "{first}/rev/study.db"], "--storage: "),  # a path, not a URL
        (["rev", "rev", "--out", "{first}", "--storage", "sqlite:///{first}/none.db"], "no such database"),
        (["rev", "gone", "--out", "{first}", "--storage", "sqlite:///{first}/rev/study.db"],
         "compare: no study 'gone' in sqlite:///"),
        (["rev", "rev", "--storage", "sqlite:///{junk}"], "cannot open"),
        (["rev", "rev", "--out", "{first}"], "compare: rev and rev are one run (study 'rev' in sqlite:///"),
        (["rev", "rev", "--out", "{first}", "--out", "{first}/../first"], "are one run"),
        (["rev", "rev", "--out", "{first}", "--out", "{first}", "--out", "{first}"],
         "--out: give it once for both runs or twice, one for each (got 3)"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_is_written(runs, tmp_path, args, says):
    junk = tmp_path / "junk.db"
    junk.write_text("not a database\n")
    before = files(runs) | files(tmp_path)
    paths = {"first": runs / "first", "junk": junk}
    markdown = tmp_path / "compare.md"
    result = invoke(*(a.format(**paths) for a in args), "--markdown", str(markdown))
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ") and says in line, line
    assert result.stdout == ""
    assert files(runs) | files(tmp_path) == before  # no storage, folder or Markdown made


def test_ablate_storage_is_both_runs_storage_as_one_storage_flag_is(runs):
    url = f"sqlite:///{runs / 'first' / 'rev' / 'study.db'}"
    result = invoke("rev", "rev-other", env={"ABLATE_STORAGE": url})
    assert result.exit_code == 2 and f"compare: no study 'rev-other' in {url}" in result.stderr


def test_a_markdown_file_that_cannot_be_written_is_one_line_before_anything_is_printed(runs, tmp_path):
    proc = ablate("compare", "rev", "rev", "--out", str(runs / "first"), "--out", str(runs / "rerun"),
                  "--markdown", str(tmp_path / "missing" / "compare.md"))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: ") and "missing" in line, line
    assert proc.stdout == "" and not (tmp_path / "missing").exists()
