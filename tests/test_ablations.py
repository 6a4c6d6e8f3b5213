"""Every bundled study file validates and runs one tiny trial, so none of them rots."""

from __future__ import annotations

import pytest
from sword_fixture import debian_bibles_missing

from ablate.analysis.stats import metric_range
from ablate.harness.study.validate import load_study
from ablate.harness.trial import run_trial
from ablate.schema.spec import bundled_studies_dir

STUDIES = sorted(bundled_studies_dir().glob("*.yaml"))
# Shrinks any study's trial to seconds; task sizes stay as the study sets them except where capped here.
TINY = {
    "model.d_model": 16, "model.layers": 1, "model.d_ff": 32, "model.dropout": 0.0,
    "train.max_steps": 2, "train.val_every": 1, "train.batch_size": 16,
    "task.n_train": 64, "task.n_valid": 16, "task.n_test": 16,
}  # fmt: skip


def test_the_suites_are_all_there():
    names = {p.stem for p in STUDIES}
    assert {"quickstart", "bottleneck", "rnn-scores", "transformer-scaling", "transformer-heads", "positional",
            "norm-residual", "scan", "rank-collapse", "causal-mask", "causal-positions",
            "bible"} <= names  # fmt: skip


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_study_runs_one_tiny_trial(path, single_thread):
    spec = load_study(path, read_data=False)  # the trial reads the data, where the machine has it
    assert spec.description.strip(), f"{path.name} says what it tests"  # its claims: test_bundled_claims.py
    name, overrides = next(iter(spec.variant_overrides().items()))
    cfg = spec.config_for(overrides, spec.seed_pool[0], TINY)
    if cfg.task.name in ("bible", "bible_lm") and debian_bibles_missing():
        pytest.skip(f"{path.name} {debian_bibles_missing()}")
    result = run_trial(cfg)
    bounds = metric_range(spec.metric.name)
    assert bounds.low <= result.metrics[spec.metric.name] <= bounds.high
