"""The study as optuna-dashboard shows it: the report's summary as the eval study's note, a note per trial
(both rendered by reports.render) and the key figures as plotly graphs, rewritten at every report build
(derived, never the study's data). Without optuna-dashboard nothing is written; without plotly, no figures."""

from __future__ import annotations

import importlib.util

import optuna
import pandas as pd

from ablate.analysis.stats import mean_table
from ablate.harness import compat
from ablate.reports.collect import StudyData
from ablate.reports.plots import RANGE_PAD, completed, length_accuracy
from ablate.schema.metric_registry import metric_range
from ablate.schema.trials import optuna_study_name


def publish(
    data: StudyData,
    summary: pd.DataFrame,
    note: str,
    trial_notes: dict[int, str],
    storage,
    train_max_len: int | None,
) -> bool:
    """Writes the study note `note`, each trial's note (by trial number) and the figures into the eval
    study; False when optuna-dashboard is not installed."""
    if importlib.util.find_spec("optuna_dashboard") is None:
        return False
    import optuna_dashboard

    study = optuna.load_study(study_name=optuna_study_name(data.spec), storage=storage)
    _save_note(study, note)
    for trial in study.get_trials(deepcopy=False):
        if trial.number in trial_notes:
            _save_note(optuna.Trial(study, compat.trial_id(trial)), trial_notes[trial.number])
    if importlib.util.find_spec("plotly") is not None:
        metric, order = data.spec.metric.name, list(data.spec.variant_overrides())
        made = {"metric_by_variant": metric_by_variant(data.trials, summary, metric, order),
                "accuracy_by_length": accuracy_by_length(data.per_length, order, train_max_len)}  # fmt: skip
        for graph_id, figure in made.items():
            if figure is not None:
                optuna_dashboard.save_plotly_graph_object(study, figure, graph_object_id=graph_id)
    return True


def _save_note(study_or_trial, body: str) -> None:
    """Saves only a changed note: each save adds a version, and a rebuilt report mostly changes nothing."""
    import optuna_dashboard

    if optuna_dashboard.get_note(study_or_trial) != body:
        optuna_dashboard.save_note(study_or_trial, body)


def metric_by_variant(df: pd.DataFrame, summary: pd.DataFrame, metric: str, order: list[str]):
    """The report's per-variant mean with its 95% CI (from `summary`) and every seed's value as a point."""
    import plotly.graph_objects as go

    seeds = completed(df, metric)
    if seeds.empty:
        return None
    rows = summary.set_index("variant").reindex(order)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=seeds["variant"], y=seeds[metric], mode="markers", name="seed", marker={"color": "#6baed6", "size": 8},
        text=[f"trial {t}, seed {s}" for t, s in zip(seeds["trial"], seeds["seed"])],
    ))  # fmt: skip
    fig.add_trace(go.Scatter(
        x=order, y=rows["mean"], mode="markers", name="mean, 95% CI",
        marker={"color": "#08306b", "symbol": "diamond", "size": 11},
        error_y={"type": "data", "array": rows["ci_high"] - rows["mean"], "arrayminus": rows["mean"] - rows["ci_low"]},
    ))  # fmt: skip
    fig.update_layout(title=f"{metric} per variant: mean with 95% CI, one point per seed", yaxis_title=metric,
                      xaxis={"categoryorder": "array", "categoryarray": order})  # fmt: skip
    rng = metric_range(metric)
    if rng.bounded:  # the whole range, as the report's figure shows it
        pad = RANGE_PAD * (rng.high - rng.low)
        fig.update_layout(yaxis_range=[rng.low - pad, rng.high + pad])
    return fig


def length_curves(seeds: pd.DataFrame, order: list[str]) -> pd.DataFrame:
    """The report figure's table: mean exact match over `seeds` (plots.length_accuracy) by variant and target
    length, with its 95% CI (stats.mean_table); columns variant, length, mean, ci_low, ci_high, seeds."""
    out = mean_table(seeds.sort_values("length"), ["variant", "length"], "seq_acc", "n")
    rank = {v: i for i, v in enumerate(order)}
    return out.sort_values(["variant", "length"], key=lambda c: c.map(rank) if c.name == "variant" else c)


def accuracy_by_length(per_length: pd.DataFrame, order: list[str], train_max_len: int | None):
    """Exact match against target length per variant (mean over seeds, 95% CI as error bars, each seed a
    faint point, as in the report's figure); the lengths beyond training shaded."""
    import plotly.graph_objects as go

    seeds = length_accuracy(per_length)
    curves = length_curves(seeds, order) if seeds is not None else None
    if curves is None or curves.empty:
        return None
    fig = go.Figure()
    for variant, c in curves.groupby("variant", sort=False):
        fig.add_trace(go.Scatter(
            x=c["length"], y=c["mean"], mode="lines+markers", name=str(variant), legendgroup=str(variant),
            error_y={"type": "data", "array": c["ci_high"] - c["mean"], "arrayminus": c["mean"] - c["ci_low"]},
        ))  # fmt: skip
        own = seeds[seeds["variant"] == variant]
        fig.add_trace(go.Scatter(
            x=own["length"], y=own["seq_acc"], mode="markers", name=f"{variant}: seeds", legendgroup=str(variant),
            showlegend=False, opacity=0.5, marker={"size": 5}, text=[f"seed {s}" for s in own["seed"]],
        ))  # fmt: skip
    longest = int(curves["length"].max())
    if train_max_len is not None and longest > train_max_len:
        fig.add_vrect(x0=train_max_len + 0.5, x1=longest + 0.5, fillcolor="#999999", opacity=0.15, line_width=0,
                      annotation_text="beyond training", annotation_position="top left")  # fmt: skip
    fig.update_layout(title="Exact match by target length (test splits): mean over seeds, 95% CI",
                      xaxis_title="target length (tokens)", yaxis_title="exact match",
                      yaxis_range=[-RANGE_PAD, 1 + RANGE_PAD])  # fmt: skip
    return fig
