"""The trial table: one row per eval trial, read from the Optuna storage alone (each trial's metrics are
user attributes), so the sweep's looks and the report judge the same numbers."""

from __future__ import annotations

import optuna
import pandas as pd

from ablate.schema.spec import StudySpec
from ablate.schema.trials import trial_seed, trial_variant

# Cost figures a trial may store as user attributes next to params and wall_time.
COST_COLUMNS = ["params", "wall_time", "tokens_per_sec", "peak_mem_mb", "steps"]


def trials_frame(spec: StudySpec, trials: list[optuna.trial.FrozenTrial]) -> pd.DataFrame:
    """Columns: trial, variant, seed, state, one per factor key and tuned key (dotted), the cost columns,
    one per metric (named split/metric), one per split's example count (examples/split), fail_reason,
    retry_of (the failed trial this one retries), resumed_from_step (0: started afresh), start and end times.
    Cost figures a trial did not store as user attributes are filled from its metrics.json
    artifact by `collect`."""
    overrides = spec.variant_overrides()
    rows = []
    for t in trials:
        variant, seed = trial_variant(t), trial_seed(t)  # a waiting trial has them as fixed params only
        attrs = t.user_attrs
        rows.append({
            "trial": t.number, "variant": variant, "seed": seed, "state": t.state.name,
            **overrides.get(variant, attrs.get("factors", {})),
            **{c: attrs.get(c) for c in COST_COLUMNS},
            **attrs.get("tuned", {}),
            **attrs.get("metrics", {}),
            **{examples_column(split): n for split, n in (attrs.get("split_sizes") or {}).items()},
            "fail_reason": attrs.get("fail_reason"),
            "retry_of": (t.system_attrs.get("retry_history") or [None])[-1],
            "resumed_from_step": attrs.get("resumed_from_step", 0),
            "started": t.datetime_start, "completed": t.datetime_complete,
        })  # fmt: skip
    columns = [
        "trial",
        "variant",
        "seed",
        "state",
        *COST_COLUMNS,
        "fail_reason",
        "retry_of",
        "resumed_from_step",
    ]
    return pd.DataFrame(rows, columns=list(dict.fromkeys(columns + [k for r in rows for k in r])))


def examples_column(split: str) -> str:
    """The trial table's column of how many examples a split held (the trial's 'split_sizes')."""
    return f"examples/{split}"


def latest_trials(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of each grid point's (variant, seed) latest trial, in trial order (a trial's own rows in
    theirs): a retried point counts once, with the run that replaced the others."""
    rows = rows.sort_values("trial", kind="stable")
    return rows[rows["trial"] == rows.groupby(["variant", "seed"], dropna=False)["trial"].transform("max")]
