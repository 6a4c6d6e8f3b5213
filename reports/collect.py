"""The tidy table: one row per trial of a study's eval phase, read from the Optuna storage alone."""

from __future__ import annotations

import optuna
import pandas as pd

from harness.study import StudySpec, optuna_study_name


def trials_frame(spec: StudySpec, storage) -> pd.DataFrame:
    """Columns: trial, variant, seed, state, one per factor key, params, wall_time, one per metric, fail_reason."""
    study = optuna.load_study(study_name=optuna_study_name(spec), storage=storage)
    rows = []
    for t in study.get_trials(deepcopy=False):
        attrs = t.user_attrs
        row = {
            "trial": t.number,
            "variant": t.params.get("variant"),
            "seed": t.params.get("seed"),
            "state": t.state.name,
            **attrs.get("factors", {}),
            "params": attrs.get("params"),
            "wall_time": attrs.get("wall_time"),
            **attrs.get("metrics", {}),
            "fail_reason": attrs.get("fail_reason"),
        }
        rows.append(row)
    columns = ["trial", "variant", "seed", "state", "params", "wall_time", "fail_reason"]
    return pd.DataFrame(rows, columns=list(dict.fromkeys(columns + [k for r in rows for k in r])))


def metric_columns(df: pd.DataFrame) -> list[str]:
    """Metric columns are the ones named split/metric, e.g. test/seq_acc."""
    return [c for c in df.columns if "/" in c]
