"""Writes a study's report: report.html (self-contained, figures embedded), report.md, results.csv and
the figures as PNG; with W&B online, the tables and figures also go to a summary run in the study's
group. Every file is written whole or not at all."""

from __future__ import annotations

import base64
import io
import json
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pandas as pd
import yaml
from jinja2 import Environment, PackageLoader
from markupsafe import Markup

from ablate.analysis import claims, stats
from ablate.harness import artifacts, attention_maps, tracking
from ablate.harness.chatter import quiet_experimental
from ablate.harness.metrics import BLEU_BUCKET, BLEU_BUCKET_SENTENCES
from ablate.harness.provenance import environment
from ablate.harness.study.queue import study_progress
from ablate.reports import columns, dashboard, headline, paired, plots
from ablate.reports.collect import StudyData, collect
from ablate.reports.files import write_whole
from ablate.reports.formats import md_cell, number, pvalue
from ablate.schema.spec import StudySpec, short_name, tune_metric, validation_metric
from ablate.schema.tasks import CORPUS_TASKS
from ablate.schema.text import csv_cell, shown

ATTENTION_VARIANTS = 4  # heatmap rows: the baseline, then the best-ranked variants with cross attention


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plots.plt.close(fig)
    return buf.getvalue()


def variant_summary(data: StudyData) -> pd.DataFrame:
    """stats.summarize plus each variant's mean parameters, training time and probe AER."""
    spec, df = data.spec, data.trials
    order = list(spec.variant_overrides())
    summary = stats.summarize(df, spec.metric.name, order, spec.baseline_variant(), spec.metric.direction)
    done = df[df["state"] == "COMPLETE"]
    for cost in ("params", "wall_time"):
        means = pd.to_numeric(done[cost], errors="coerce").groupby(done["variant"]).mean()
        summary[cost] = summary["variant"].map(means)
    aer = {}
    for trial, samples in data.attention.items():
        variant = df.loc[df["trial"] == trial, "variant"].iloc[0]
        aer.setdefault(variant, []).extend(attention_maps.probe_aer(s) for s in samples)
    summary["aer"] = summary["variant"].map(
        {v: float(np.nanmean(a)) for v, a in aer.items() if np.isfinite(a).any()}
    )
    return summary


def attention_samples(data: StudyData, summary: pd.DataFrame) -> dict[str, list]:
    """Probe samples of the first completed seed of the baseline and the best-ranked variants."""
    df = data.trials.set_index("trial")
    first_trial: dict[str, int] = {}  # variant -> its trial with the lowest seed that has cross attention
    for trial in sorted(data.attention, key=lambda t: df.at[t, "seed"]):
        if any(attention_maps.cross_attention(s) is not None for s in data.attention[trial]):
            first_trial.setdefault(df.at[trial, "variant"], trial)
    ranked = summary.sort_values("rank", na_position="last")["variant"].tolist()
    chosen = [v for v in dict.fromkeys([data.spec.baseline_variant(), *ranked]) if v in first_trial]
    return {v: data.attention[first_trial[v]] for v in chosen[:ATTENTION_VARIANTS]}


# PED-ANOVA (Watanabe 2023), named rather than left to Optuna's default, which was fANOVA before Optuna 5
# (it needs scikit-learn, not a dependency here) and PED-ANOVA from 5 on: the caption names what ran.
IMPORTANCE_METHOD = "PED-ANOVA"


def importance_evaluator() -> optuna.importance.BaseImportanceEvaluator:
    with quiet_experimental():  # flagged experimental before Optuna 5
        return optuna.importance.PedAnovaImportanceEvaluator()


def importance_frame(data: StudyData) -> pd.DataFrame:
    """Parameter importances (IMPORTANCE_METHOD) of the tuned parameters, per variant's tune trials."""
    if data.spec.tune is None:
        return pd.DataFrame(columns=["variant", "param", "importance"])
    rows = []
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # scratch studies need no announcement
    try:
        for variant, trials in data.tune.items():
            params = [p for p in data.spec.tune.params if sum(p in t.params for t in trials) >= 2]
            if len(trials) < 2 or not params:
                continue
            study = optuna.create_study(direction=tune_metric(data.spec).direction)
            study.add_trials([t for t in trials if all(p in t.params for p in params)])
            try:
                importances = optuna.importance.get_param_importances(
                    study, evaluator=importance_evaluator(), params=params
                )
            except (RuntimeError, ValueError):
                continue  # e.g. every trial sampled the same value: nothing to attribute
            rows += [{"variant": variant, "param": p, "importance": v} for p, v in importances.items()]
    finally:
        optuna.logging.set_verbosity(verbosity)
    return pd.DataFrame(rows, columns=["variant", "param", "importance"])


def train_max_len(data: StudyData) -> int | None:
    """The longest training length of any trial: beyond it, accuracy and BLEU by length are extrapolation.
    A corpus task's is task.max_tokens (longer test pairs form test_long; bible_lm's windows train at
    task.train_factor times it), any other's task.max_len."""
    def limit(config: dict[str, Any]) -> int | None:
        if config.get("task.name") not in CORPUS_TASKS:
            return config.get("task.max_len")
        tokens = config.get("task.max_tokens")
        return tokens * config.get("task.train_factor", 1) if tokens is not None else None

    max_lens = [limit(c) for c in data.configs.values() if limit(c) is not None]
    return max(max_lens) if max_lens else None


def figures(
    data: StudyData, summary: pd.DataFrame, importances: pd.DataFrame
) -> dict[str, tuple[bytes, str]]:
    """Figure name -> (PNG, caption), for the figures the study has data for."""
    spec, df = data.spec, data.trials
    metric, order = spec.metric.name, list(spec.variant_overrides())
    maximize = spec.metric.direction == "maximize"
    made: dict[str, tuple[Any, str]] = {
        "metric_by_variant": (plots.metric_by_variant(df, metric, order),
                              f"{metric} per variant: mean with 95% CI, one point per seed."),
    }  # fmt: skip
    factors = [k for k, v in spec.factors.items() if len(v) > 1]
    for factor in factors:
        others = [k for k in factors if k != factor]
        made[f"metric_by_{short_name(factor)}"] = (
            plots.metric_by_factor(df, metric, factor, others),
            f"{metric} by {factor}"
            + (f", faceted by {others[0]}" if others else "")
            + ": mean with 95% CI, one point per seed.",
        )
    split_metric = metric.split("/", 1)[-1]
    made["learning_curves"] = (
        plots.learning_curves(
            data.history, list(dict.fromkeys([f"val/{split_metric}", "val/loss"])), order, df
        ),
        "Validation curves by training step: mean over seeds with a 95% CI band, one point per seed; "
        "an unbounded metric's axis ends at 1.5 times its largest seed, and a wider band is cut at the axis.",
    )
    made["accuracy_by_length"] = (
        plots.accuracy_by_length(data.per_length, order, train_max_len(data)),
        "Exact match against target length (test splits), mean over seeds with 95% CI, one point per seed; "
        "shaded: lengths longer than any training example.",
    )
    made["bleu_by_length"] = (
        plots.bleu_by_length(data.translations, order, train_max_len(data)),
        f"Corpus BLEU against source sentence length (buckets of {BLEU_BUCKET} tokens, a sparser tail pooled "
        f"until a bucket holds {BLEU_BUCKET_SENTENCES} sentences a trial; test splits pooled; Bahdanau et al. "
        "2015, Fig. 2), mean over seeds with 95% CI, one point per seed; shaded: sources longer than any "
        "training pair. The axis ends above the highest interval, not at 100.",
    )
    probes = attention_samples(data, summary)
    shaded = any(attention_maps.labels_one(s) for samples in probes.values() for s in samples)
    pictured = any(s.image for samples in probes.values() for s in samples)
    made["attention"] = (
        plots.attention_maps(probes),
        "Probe texts of the baseline and the best variants, each token shaded by the classifier's attention "
        "pooling and by its gradient importance (each over the text's largest); red underlines: the gold "
        "rationale; AER of the attention argmax in each title." if shaded else
        "Probe images of the baseline and the best variants, one band per emitted token (top to bottom), each "
        "pixel lit by the attention that step paid it (over the step's largest; heads averaged); red boxes: "
        "the image of the digit emitted; AER of the attention argmax in each title." if pictured else
        "Cross-attention of probe examples (last layer, heads averaged) for the baseline and the best "
        "variants; red squares: gold alignment; AER of the attention argmax in each title.",
    )  # fmt: skip
    made["quality_vs_cost"] = (
        plots.quality_vs_cost(summary, df, metric, maximize),
        "Quality against cost per variant (mean, 95% CI; light points: single trials); the line joins "
        "the Pareto front.",
    )
    made["param_importances"] = (
        plots.param_importances(importances),
        f"Importance of each tuned parameter in the tune phase (Optuna's {IMPORTANCE_METHOD}).",
    )
    return {name: (_png(fig), caption) for name, (fig, caption) in made.items() if fig is not None}


def trial_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The trial table's rows, each failed trial that was queued again noting its retry."""
    retried_by = {int(r): int(t) for t, r in zip(df["trial"], df["retry_of"]) if pd.notna(r)}
    return [{**row, "retried_by": retried_by.get(row["trial"])} for row in df.to_dict("records")]


def reproducibility(data: StudyData, summary: pd.DataFrame) -> dict[str, Any]:
    spec, df = data.spec, data.trials
    done = df[df["state"] == "COMPLETE"]
    metric, maximize = spec.metric.name, spec.metric.direction == "maximize"
    tune_maximize = spec.tune is not None and tune_metric(spec).direction == "maximize"
    best_eval = []
    if metric in done and len(done):
        values = pd.to_numeric(done[metric], errors="coerce")
        for variant, idx in (
            values.groupby(done["variant"]).agg("idxmax" if maximize else "idxmin").dropna().items()
        ):
            best_eval.append({"variant": variant, "trial": int(done.at[idx, "trial"]),
                              "seed": done.at[idx, "seed"], "value": float(values[idx])})  # fmt: skip
    best_tune = []
    for variant, trials in data.tune.items():
        best = (max if tune_maximize else min)(trials, key=lambda t: t.value)
        best_tune.append(
            {"variant": variant, "trials": len(trials), "value": best.value, "params": best.params}
        )
    overall = min(best_eval, key=lambda r: -r["value"] if maximize else r["value"]) if best_eval else None
    wall = pd.to_numeric(df["wall_time"], errors="coerce")
    started, completed = pd.to_datetime(df["started"]).dropna(), pd.to_datetime(df["completed"]).dropna()
    return {
        "grid": len(df[["variant", "seed"]].drop_duplicates()),  # the grid points queued
        "states": df["state"].value_counts().to_dict(),
        "tune_trials": sum(len(t) for t in data.tune.values()),
        "resumed": int((pd.to_numeric(done["resumed_from_step"], errors="coerce") > 0).sum()),
        "search": spec.tune.model_dump() if spec.tune else None,
        "best_eval": best_eval,
        "best_tune": best_tune,
        "signatures": sorted(
            {
                f"{name} {signature}"
                for recorded in data.recorded.get("signatures", [])
                for name, signature in json.loads(recorded).items()
            }
        ),  # fmt: skip
        "best_config": data.configs.get(overall["trial"], {}) if overall else {},
        "best_trial": overall,
        "seeds": seeds_text(spec),
        "seeds_run": seeds_run(spec, df),
        "recorded": data.recorded,
        "environment": environment(),
        "total_time": float(wall.sum()) if wall.notna().any() else None,
        "mean_time": float(wall.mean()) if wall.notna().any() else None,
        "span": (f"{started.min():%Y-%m-%d %H:%M:%S}", f"{completed.max():%Y-%m-%d %H:%M:%S}")
        if len(started) and len(completed)
        else None,
        "params": summary[["variant", "params"]].dropna().to_dict("records"),
        "spec_yaml": yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False, allow_unicode=True),
    }


def seeds_text(spec: StudySpec) -> str:
    """The study's seeds: '0, 1, 2', or 'adaptive: 2 to 4 per variant (3 looks)', with ', seeds 100-103'
    where a range does not start at 0."""
    if spec.adaptive is None:
        return ", ".join(map(str, spec.seed_pool))
    text = f"adaptive: {spec.adaptive.min} to {spec.adaptive.max} per variant ({len(spec.seed_looks)} looks)"
    return text + (f", seeds {spec.seed_pool[0]}-{spec.seed_pool[-1]}" if spec.adaptive.start else "")


def seeds_run(spec: StudySpec, df: pd.DataFrame) -> str:
    """How many seeds each variant completed: '3 variants x 2 seeds', or per variant when they differ."""
    done = df[df["state"] == "COMPLETE"].drop_duplicates(["variant", "seed"]).groupby("variant").size()
    counts = {v: int(done.get(v, 0)) for v in spec.variant_overrides()}
    if len(set(counts.values())) == 1:
        return f"{len(counts)} variants × {next(iter(counts.values()))} seeds"
    return ", ".join(f"{v} {n}" for v, n in counts.items()) + " seeds"


def _environment(html: bool) -> Environment:
    # Every value a template writes goes through `shown` (control characters escaped), but what is already
    # markup the report made (Markup: figures, tables it built).
    env = Environment(
        loader=PackageLoader("ablate.reports", "templates"), autoescape=html, trim_blocks=True, lstrip_blocks=True,
        finalize=lambda v: shown(v) if isinstance(v, str) and not isinstance(v, Markup) else v,
    )  # fmt: skip
    env.filters.update(num=number, pvalue=pvalue, md=md_cell)
    env.globals.update(zip=zip)
    return env


def build_report(
    spec: StudySpec,
    storage,
    runs_root: str | Path = "runs",
    out: str | Path | None = None,
    wandb_mode: tracking.WandbMode | None = None,
    artifact_location: str | None = None,
) -> Path:
    """Reads the study from `storage` (and its trials' files from the artifact store: the one under
    runs_root, or the s3:// `artifact_location`) and writes the report to `out` (default
    runs/<study>/report/), and its summary and figures to the dashboard; returns that folder."""
    artifacts.check_run_folder(spec.slug, runs_root)
    out_dir = Path(out) if out else artifacts.report_dir(spec.slug, runs_root)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = collect(spec, storage, runs_root, artifact_location)
    summary = variant_summary(data)
    variants = list(spec.variant_overrides())
    importances = importance_frame(data)
    figs = figures(data, summary, importances)
    verdicts = claims.evaluate_all(spec, data.trials)
    context = {
        "spec": spec,
        "metric": spec.metric.name,
        "baseline": spec.baseline_variant(),
        "headline": headline.headline(data, summary, verdicts),
        "variant_table": columns.variant_table(summary, spec.baseline_variant()),
        "note_table": columns.variant_table(summary, spec.baseline_variant(), columns.NOTE_HEADERS),
        "table_notes": headline.table_notes(summary),
        "claims": verdicts,
        "claim_groups": headline.claim_groups(verdicts),
        "look_level": claims.look_level(spec),
        "progress": [asdict(row) for row in study_progress(spec, storage)],
        "trials": trial_rows(data.trials),
        "importances": importances.to_dict("records"),
        "importance_method": IMPORTANCE_METHOD,
        "repro": reproducibility(data, summary),
        "figures": {k: (base64.b64encode(png).decode(), caption) for k, (png, caption) in figs.items()},
        "validation_metric": validation_metric(spec.metric).name,
        "paired": paired.paired_tests(data.translations, variants, spec.baseline_variant()),
        "paired_resamples": paired.RESAMPLES,
        "bleu_bucket": BLEU_BUCKET,
        "bleu_bucket_sentences": BLEU_BUCKET_SENTENCES,
    }
    write_files(out_dir, figs, data.trials, context)
    markdown = _environment(False)
    trial_note = markdown.get_template("trial_note.md.j2")
    dashboard.publish(
        data, summary, markdown.get_template("note.md.j2").render(**context),
        {t["trial"]: trial_note.render(t=t, metric=spec.metric.name) for t in context["trials"]},
        storage, train_max_len(data),
    )  # fmt: skip
    if tracking.resolve_mode(wandb_mode) == "online":
        try:
            log_summary_run(
                spec, summary, out_dir, list(figs), "online", artifacts.study_dir(spec.slug, runs_root)
            )
        except Exception as e:  # the report is written; W&B is a copy of it and must not undo it
            warnings.warn(f"W&B: the report summary run failed ({type(e).__name__}: {e})", stacklevel=2)
    return out_dir


def write_files(out_dir: Path, figs: dict[str, tuple[bytes, str]], trials: pd.DataFrame, context: dict) -> None:
    """The report's files, each written whole: the figures, the trial table, report.md and report.html."""
    for name, (png, _) in figs.items():
        write_whole(out_dir / f"{name}.png", png)
    write_whole(out_dir / artifacts.RESULTS_CSV, trials.map(csv_cell).to_csv(index=False))
    for name, html in ((artifacts.REPORT_MD, False), (artifacts.REPORT_HTML, True)):
        write_whole(out_dir / name, _environment(html).get_template(f"{name}.j2").render(**context))


def log_summary_run(
    spec: StudySpec, summary: pd.DataFrame, report_dir: Path, figure_names: list[str], mode, directory: Path
) -> None:
    """One W&B run in the study's group (job_type 'report') holding the variant table, results.csv as a
    table, and every figure."""
    import wandb

    results = pd.read_csv(report_dir / artifacts.RESULTS_CSV)
    with tracking.wandb_logger(mode, directory, group=spec.name, name=f"{spec.name}-report", job_type="report",
                               tags=["report"], config=spec.model_dump(mode="json")) as logger:  # fmt: skip
        if logger is None:
            return
        run = logger.experiment
        run.log({
            "report/variants": wandb.Table(dataframe=summary.astype(object).where(summary.notna(), None)),
            "report/trials": wandb.Table(dataframe=results.astype(object).where(results.notna(), None)),
            **{f"report/{name}": wandb.Image(str(report_dir / f"{name}.png")) for name in figure_names},
        })  # fmt: skip
        run.save(str(report_dir / artifacts.REPORT_HTML), base_path=str(report_dir), policy="now")
