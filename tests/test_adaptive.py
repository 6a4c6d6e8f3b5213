"""Adaptive seeds: the study-file form, looks judged by the report's claim code, each added seed queued
exactly once when several workers reach a look together, and the check on real training."""

from __future__ import annotations

import threading

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from conftest import ablate
from optuna.trial import TrialState
from pydantic import ValidationError
from test_postgres import postgres_url  # noqa: F401  (a fixture)
from typer.testing import CliRunner

from ablate.analysis import claims
from ablate.analysis.claims import INCONCLUSIVE, PENDING, REPRODUCED
from ablate.cli import app
from ablate.harness.artifacts import default_storage_url
from ablate.harness.study import looks
from ablate.harness.study.queue import load_phase_study, prepare_study
from ablate.harness.study.storage import open_storage
from ablate.harness.study.validate import load_study
from ablate.reports.render import seeds_text
from ablate.schema.errors import ConfigError
from ablate.schema.spec import StudySpec
from ablate.schema.trials import EVAL, grid_point, trial_seed

optuna.logging.set_verbosity(optuna.logging.WARNING)

METRIC = "test/tok_acc"  # two seeds a side decide a claim on it (exact match needs three)
VARIANTS = {
    "pos": {"preset": "transformer"},
    "nopos": {"preset": "transformer", "model.pos_encoding": "none"},
    "pre": {"preset": "transformer", "model.norm": "pre"},
}
# Selectors see the keys the preset sets (model.norm: post, model.pos_encoding: sinusoidal), so each `to`
# names both to select pos alone.
POS = {"model.pos_encoding": "sinusoidal", "model.norm": "post"}
CLAIMS = [
    {"text": "Without positions a Transformer cannot reverse.", "compare": {"model.pos_encoding": "none"},
     "to": POS, "expect": "lower", "margin": 0.3},
    {"text": "Pre-LN does as well as post-LN.", "compare": {"model.norm": "pre"}, "to": POS,
     "expect": "similar", "margin": 0.000001},
]  # fmt: skip


def adaptive_spec(seeds=None, **extra) -> StudySpec:
    return StudySpec.model_validate(
        {
            "name": "adaptive",
            "variants": VARIANTS,
            "claims": CLAIMS,
            "seeds": seeds or {"min": 2, "max": 4},
            "metric": {"name": METRIC},
            **extra,
        }
    )


def test_the_study_file_takes_a_seed_range_or_a_list():
    spec = adaptive_spec({"min": 3, "max": 10})
    assert spec.seed_pool == list(range(10)) and spec.seed_looks == [3, 4, 5, 6, 7, 8, 9, 10]
    spec = adaptive_spec({"min": 3, "max": 10, "step": 3})
    assert spec.seed_looks == [3, 6, 9, 10]
    spec = adaptive_spec({"min": 2, "max": 4, "start": 100})
    assert spec.seed_pool == [100, 101, 102, 103] and spec.seed_looks == [2, 3, 4]
    spec = adaptive_spec([4, 7])
    assert spec.adaptive is None and spec.seed_pool == [4, 7] and spec.seed_looks == [2]
    for seeds, message in (({"min": 1, "max": 4}, "min"), ({"min": 3, "max": 2}, "max"),
                           ({"min": 2, "max": 4, "every": 1}, "every"),
                           ({"min": 2, "max": 4, "start": -1}, "start")):  # fmt: skip
        with pytest.raises(ValidationError, match=message):
            adaptive_spec(seeds)


@pytest.mark.parametrize(
    "seeds, message",
    [("{min: 1, max: 4}", "seeds.min: Input should be greater than or equal to 2 (got 1)"),
     ("{min: 3, max: 2}", "seeds.max: must be at least min=3 (got 2)"),
     ("{min: 2, max: 4, every: 1}", "seeds.every: unknown config key"), ("{min: 2}", "seeds.max: Field required"),
     ("{min: 2, max: 4, start: 4294967294}",
      "seeds.start: Input should be less than 4294967296 (got 4294967297)")],
)  # fmt: skip
def test_a_bad_seed_range_is_named_in_one_line(tmp_path, seeds, message):
    study = tmp_path / "bad.yaml"
    study.write_text(f"name: bad\nvariants: {{a: {{preset: lstm}}}}\nseeds: {seeds}\n")
    with pytest.raises(ConfigError) as caught:
        load_study(study)
    assert str(caught.value) == f"{study}: {message}"


def table(values: dict[str, list[float]], states: dict[tuple[str, int], str] | None = None) -> pd.DataFrame:
    """A trial table: one trial per (variant, seed) holding the given value, COMPLETE unless `states` says."""
    rows = [{"trial": 0, "variant": v, "seed": seed, "state": (states or {}).get((v, seed), "COMPLETE"),
             METRIC: x, "examples/test": 64} for v, xs in values.items() for seed, x in enumerate(xs)]  # fmt: skip
    return pd.DataFrame(rows).assign(trial=range(len(rows)))


def test_a_claim_is_decided_at_its_first_decisive_look_and_only_open_claims_want_seeds():
    spec = adaptive_spec()
    assert claims.look_level(spec) == pytest.approx(1 - 0.05 / 3)
    at_first_look = table({"pos": [1.0, 1.0], "nopos": [0.031, 0.016], "pre": [1.0, 0.97]})
    positions, norm = claims.evaluate_all(spec, at_first_look)
    assert (positions.verdict, positions.decided, positions.look, positions.seeds) == (REPRODUCED, True, 0, 2)
    assert positions.decision == "look 1 of 3 (2 seeds, 98.3% CIs)"
    assert (norm.verdict, norm.decided, norm.budget_spent) == (INCONCLUSIVE, False, False)
    assert claims.seeds_wanted(spec, [positions, norm]) == {"pre": 3, "pos": 3}

    # pos and pre ran to the budget for the open claim; the decided one is not reopened by pos's seeds.
    at_last_look = table(
        {"pos": [1.0, 1.0, 0.97, 1.0], "nopos": [0.031, 0.016], "pre": [1.0, 0.97, 1.0, 0.98]}
    )
    positions, norm = claims.evaluate_all(spec, at_last_look)
    assert (positions.look, positions.decided, positions.n_to) == (0, True, 2)
    assert (norm.look, norm.budget_spent, norm.n_compare) == (2, True, 4)
    # Δ -0.005 against a margin of 1e-6, CI half-width 0.07 at 4 seeds: about 190 seeds would contradict it.
    assert (
        norm.decision
        == "budget spent (4 seeds, 98.3% CIs); about 192 seeds per variant would decide it at this spread"
    )
    assert claims.seeds_wanted(spec, [positions, norm]) == {}


def test_a_running_look_gives_a_provisional_verdict_and_wants_nothing():
    spec = adaptive_spec()
    df = table(
        {"pos": [1.0, 1.0, np.nan], "nopos": [0.031, 0.016], "pre": [1.0, 0.97, 0.99]},
        {("pos", 2): "RUNNING"},
    )
    positions, norm = claims.evaluate_all(spec, df)
    assert positions.decided and positions.look == 0
    assert (norm.look, norm.running, norm.decided) == (
        1,
        True,
        False,
    ) and norm.decision == "open: look 2 of 3 running"
    assert claims.seeds_wanted(spec, [positions, norm]) == {}


def test_a_claim_whose_first_look_is_not_queued_yet_is_running_and_wants_nothing():
    # Only pre has trials: neither claim's variants have all their first look's seeds queued.
    spec = adaptive_spec()
    positions, norm = claims.evaluate_all(spec, table({"pre": [1.0, 0.97]}))
    assert positions.running and norm.running and not (positions.decided or positions.budget_spent)
    assert positions.level == norm.level == claims.look_level(spec)
    assert positions.decision == "open: look 1 of 3 running"
    assert claims.seeds_wanted(spec, [positions, norm]) == {}
    # One seed listed, one variant without its trial: the look was not reached, whatever the count.
    (positions, _) = claims.evaluate_all(adaptive_spec([0]), table({"pos": [1.0], "pre": [1.0]}))
    assert positions.running and not positions.budget_spent


def test_a_decided_claim_keeps_its_look_when_its_variants_run_on_for_another_claim():
    # Both claims compare pre with pos: the first is decided at look 1, the second (token accuracy beyond
    # the training lengths, similar within 1e-6) stays open and takes pre and pos to a third seed. The
    # first keeps its look.
    spec = StudySpec.model_validate({"name": "adaptive", "variants": VARIANTS, "seeds": {"min": 2, "max": 4},
        "metric": {"name": METRIC},
        "claims": [{"text": "Pre-LN is far worse here.", "compare": {"model.norm": "pre"}, "to": POS,
                    "expect": "lower", "margin": 0.3},
                   {"text": "Pre-LN matches post-LN in token accuracy.", "compare": {"model.norm": "pre"},
                    "to": POS, "metric": "test_long/tok_acc", "expect": "similar", "margin": 0.000001}]})  # fmt: skip
    df = table({"pos": [1.0, 1.0, 0.97], "pre": [0.031, 0.016, 0.02]})
    df["test_long/tok_acc"] = [1.0, 0.97, 1.0, 1.0, 0.98, 0.99]
    first, second = claims.evaluate_all(spec, df)
    assert (first.verdict, first.decided, first.look, first.seeds) == (REPRODUCED, True, 0, 2)
    assert (second.verdict, second.look, second.seeds) == (INCONCLUSIVE, 1, 3)


def test_seeds_wanted_takes_the_most_any_open_claim_wants_and_skips_a_claim_without_a_side():
    spec = adaptive_spec()  # looks of 2, 3 and 4 seeds

    def open_after(look: int, compare: list[str], to: list[str]) -> claims.ClaimResult:
        return claims.ClaimResult(claim=spec.claims[0], metric=METRIC, verdict=INCONCLUSIVE, reason="",
                                  compare=compare, to=to, variants=compare + to, look=look)  # fmt: skip

    later, earlier = open_after(1, ["pre"], ["pos"]), open_after(0, ["nopos"], ["pos"])
    assert claims.seeds_wanted(spec, [later, earlier]) == {"pre": 4, "pos": 4, "nopos": 3}
    assert claims.seeds_wanted(spec, [open_after(0, ["nopos"], [])]) == {}  # `to` matched no variant


def test_a_list_of_seeds_is_one_look_at_95_percent():
    spec = adaptive_spec([0, 1])
    positions, norm = claims.evaluate_all(
        spec, table({"pos": [1.0, 1.0], "nopos": [0.031, 0.016], "pre": [1.0, 0.97]})
    )
    assert positions.level == 0.95 and positions.decided and norm.budget_spent
    assert claims.seeds_wanted(spec, [positions, norm]) == {}


# Queuing the next look --------------------------------------------------------------------------------------


def test_a_side_short_of_seeds_is_pending_while_its_trials_run_and_inconclusive_once_they_end():
    scores = {"pos": [1.0, np.nan], "nopos": [0.031, 0.016], "pre": [1.0, 0.97]}
    positions, norm = claims.evaluate_all(adaptive_spec([0, 1]), table(scores, {("pos", 1): "RUNNING"}))
    assert positions.verdict == norm.verdict == PENDING and not positions.decided
    positions, _ = claims.evaluate_all(adaptive_spec([0, 1]), table(scores, {("pos", 1): "FAIL"}))
    assert positions.verdict == INCONCLUSIVE and "1 completed seed(s)" in positions.reason


def test_status_calls_each_claim_pending_before_its_sides_have_finished_trials(tmp_path):
    spec, runs = adaptive_spec(), tmp_path / "runs"
    prepare_study(spec, open_storage(default_storage_url(spec.slug, runs)))  # queued, none run yet
    result = CliRunner().invoke(app, ["status", "adaptive", "--out", str(runs)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [line for line in result.output.splitlines() if any(c["text"] in line for c in CLAIMS)]
    assert len(rows) == 2 and all("pending" in row and "inconclusive" not in row for row in rows), rows


def test_status_shows_the_tests_first_and_the_checks_apart(tmp_path):
    spec, runs = adaptive_spec(claims=[{**CLAIMS[0], "kind": "check"}, CLAIMS[1]]), tmp_path / "runs"
    prepare_study(spec, open_storage(default_storage_url(spec.slug, runs)))
    result = CliRunner().invoke(app, ["status", "adaptive", "--out", str(runs)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.output.splitlines() if any(c["text"] in line for c in CLAIMS)]
    assert [(row[1], row[3]) for row in rows] == [("test", "Pre-LN"), ("check", "Without")]
    assert "1 test of a published finding: 1 pending; 1 check of a mechanism: 1 pending" in result.output


SCORES = {"pos": [1.0, 1.0, 0.97, 1.0], "nopos": [0.031, 0.016, 0.02, 0.0], "pre": [1.0, 0.97, 1.0, 0.98]}


def finish_waiting(spec: StudySpec, storage) -> None:
    """Runs every waiting eval trial as a worker would, storing SCORES as its metric."""
    study = load_phase_study(spec, storage, EVAL)
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        assert storage.set_trial_state_values(frozen._trial_id, TrialState.RUNNING)
        trial = optuna.Trial(study, frozen._trial_id)
        variant = trial.suggest_categorical("variant", list(spec.variant_overrides()))
        # Queued as an attribute, not a parameter to sample; SCORES holds the pool's seeds in order.
        score = SCORES[variant][spec.seed_pool.index(trial_seed(frozen))]
        trial.set_user_attr("metrics", {METRIC: score})
        trial.set_user_attr("split_sizes", {"test": 64})
        study.tell(trial, score)


def grid_points(spec: StudySpec, storage) -> list[str]:
    return sorted(
        t.user_attrs["grid_point"] for t in load_phase_study(spec, storage, EVAL).get_trials(deepcopy=False)
    )


def seeds_per_variant(spec: StudySpec, storage) -> dict[str, int]:
    points = grid_points(spec, storage)
    return {v: sum(p.startswith(f"{v}/") for p in points) for v in spec.variant_overrides()}


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request, tmp_path) -> str:
    """The default SQLite file, and a fresh PostgreSQL database (skipped without a server)."""
    if request.param == "postgresql":
        return request.getfixturevalue("postgres_url")
    return f"sqlite:///{tmp_path / 'study.db'}"


def test_looks_add_seeds_only_to_open_claims_until_the_budget(storage_url):
    spec, storage = adaptive_spec(), None
    storage = open_storage(storage_url)
    prepare_study(spec, storage)
    assert seeds_per_variant(spec, storage) == {"pos": 2, "nopos": 2, "pre": 2}
    assert looks.queue_next_look(spec, storage)  # trials still waiting: nothing to judge yet
    assert seeds_per_variant(spec, storage) == {"pos": 2, "nopos": 2, "pre": 2}
    for expected in ({"pos": 3, "nopos": 2, "pre": 3}, {"pos": 4, "nopos": 2, "pre": 4}):
        finish_waiting(spec, storage)
        assert looks.queue_next_look(spec, storage)
        assert seeds_per_variant(spec, storage) == expected
    finish_waiting(spec, storage)
    assert not looks.queue_next_look(spec, storage)  # the budget is spent: the study is finished
    assert len(grid_points(spec, storage)) == len(set(grid_points(spec, storage))) == 10


def test_a_seed_range_with_a_start_queues_its_own_seeds_at_every_look(tmp_path):
    """A replication on fresh seeds: the looks count seeds from `start`, none of 0 .. max - 1 runs."""
    spec = adaptive_spec({"min": 2, "max": 4, "start": 100})
    assert seeds_text(spec) == "adaptive: 2 to 4 per variant (3 looks), seeds 100-103"
    assert seeds_text(adaptive_spec()) == "adaptive: 2 to 4 per variant (3 looks)"
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    prepare_study(spec, storage)
    finish_waiting(spec, storage)
    assert looks.queue_next_look(spec, storage)
    finish_waiting(spec, storage)
    assert looks.queue_next_look(spec, storage)
    finish_waiting(spec, storage)
    assert not looks.queue_next_look(spec, storage)
    assert grid_points(spec, storage) == sorted(
        [grid_point(v, s) for v in ("pos", "pre") for s in (100, 101, 102, 103)]
        + [grid_point("nopos", s) for s in (100, 101)]
    )


@pytest.mark.parametrize("workers", [2, 6])
def test_workers_reaching_a_look_together_queue_each_seed_once(storage_url, monkeypatch, workers):
    spec = adaptive_spec()
    prepare_study(spec, open_storage(storage_url))
    finish_waiting(spec, open_storage(storage_url))
    # Every worker has judged the look before any of them queues: the race the lock must settle.
    judged = threading.Barrier(workers)
    plan = looks.next_look

    def next_look_together(*args):
        found = plan(*args)
        judged.wait(timeout=30)
        return found

    # Any worker that gets past the lock queues at the same moment as the others that did.
    queuing, queuers = threading.Barrier(workers), []
    queue = looks.queue_grid_points

    def queue_together(*args):
        queuers.append(threading.current_thread())
        try:
            queuing.wait(timeout=1)
        except threading.BrokenBarrierError:
            pass
        queue(*args)

    monkeypatch.setattr(looks, "next_look", next_look_together)
    monkeypatch.setattr(looks, "queue_grid_points", queue_together)
    outcomes = []
    threads = [threading.Thread(target=lambda: outcomes.append(looks.queue_next_look(spec, open_storage(storage_url))))
               for _ in range(workers)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    storage = open_storage(storage_url)
    assert outcomes == [True] * workers and len(queuers) == 1
    points = grid_points(spec, storage)
    assert len(points) == len(set(points)) == 8  # 6 + pos/seed=2 and pre/seed=2, once each
    assert seeds_per_variant(spec, storage) == {"pos": 3, "nopos": 2, "pre": 3}


def test_a_worker_that_died_holding_the_look_is_taken_over(storage_url):
    spec = adaptive_spec()
    storage = open_storage(storage_url)
    prepare_study(spec, storage)
    finish_waiting(spec, storage)
    # A worker won the look and died before queuing one of its points.
    optuna.create_study(study_name=looks.look_lock_name(spec, 1), storage=storage)
    looks.queue_grid_points(spec, load_phase_study(spec, storage, EVAL), {"pos": [0, 1, 2]})
    assert looks.queue_next_look(spec, storage, wait_s=0.2)  # pos/seed=2 waits: run it first
    assert seeds_per_variant(spec, storage) == {"pos": 3, "nopos": 2, "pre": 2}
    finish_waiting(spec, storage)
    # The look is still open and its lock unmarked after the wait: the rest is queued, once.
    assert looks.queue_next_look(spec, storage, wait_s=0.2)
    assert seeds_per_variant(spec, storage) == {"pos": 3, "nopos": 2, "pre": 3}
    assert len(grid_points(spec, storage)) == len(set(grid_points(spec, storage)))
    lock = optuna.load_study(study_name=looks.look_lock_name(spec, 1), storage=storage)
    assert lock.user_attrs["queued"] == {"pos": 3, "pre": 3}


# The check on real training ---------------------------------------------------------------------------------

# Reversing 5 symbols: within 200 steps the Transformer gets every test sequence right, and without positions
# about 40% of the tokens, so the first claim is decided at the second look (3 seeds) at 98.3% CIs. (Tested
# at step 200, the only validation: two seeds without positions vary too much to decide at the first.)
CHECK_BASE = {
    "task": {"name": "reverse", "min_len": 5, "max_len": 5, "test_max_len": 5, "vocab_size": 8, "n_train": 1000,
             "n_valid": 32, "n_test": 64},
    "model": {"d_model": 32, "layers": 1, "heads": 2, "d_ff": 64, "dropout": 0.0},
    "train": {"batch_size": 32, "lr": 0.005, "max_steps": 200, "val_every": 200},
}  # fmt: skip


@pytest.mark.slow  # eleven real trials and a report: about a minute on a quiet 2-core machine
def test_seeds_go_where_a_claim_is_open(tmp_path):
    study = tmp_path / "adaptive.yaml"
    study.write_text(yaml.safe_dump({
        "name": "adaptive", "base": CHECK_BASE, "variants": VARIANTS, "seeds": {"min": 2, "max": 4},
        "metric": {"name": METRIC}, "baseline": "pos", "claims": CLAIMS,
    }))  # fmt: skip
    runs = tmp_path / "runs"
    proc = ablate("sweep", str(study), "--out", str(runs), "--wandb", "disabled", "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    spec = adaptive_spec()
    storage = open_storage(f"sqlite:///{runs / 'adaptive' / 'study.db'}", create_dir=False)
    assert seeds_per_variant(spec, storage) == {"pos": 4, "nopos": 3, "pre": 4}
    points = grid_points(spec, storage)
    assert len(points) == len(set(points)) == 11
    md = (runs / "adaptive" / "report" / "report.md").read_text()
    positions = next(line for line in md.splitlines() if line.startswith("| Without positions"))
    norm = next(line for line in md.splitlines() if line.startswith("| Pre-LN"))
    assert "**reproduced**" in positions and "look 2 of 3 (3 seeds, 98.3% CIs)" in positions
    assert "**inconclusive**" in norm and "budget spent (4 seeds, 98.3% CIs)" in norm
    runs_line = next(line for line in md.splitlines() if line.startswith("- Runs:"))
    assert all(f"{v} {n}" in runs_line for v, n in (("pos", 4), ("nopos", 3), ("pre", 4)))
    status = ablate("status", "adaptive", "--out", str(runs))
    assert status.returncode == 0 and "finished" in status.stdout
    assert "looks at 2 3 4 seeds per variant" in status.stdout and "budget spent" in status.stdout
