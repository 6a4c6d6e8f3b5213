"""What a report reads: the tidy trial table from the Optuna storage (cost figures it lacks filled from the
trial's metrics.json), per-trial artifacts (metric history, accuracy by length, attention samples,
translations), tune studies and provenance. Artifacts are optional: a trial without them still counts in
every statistic, it only draws no curve."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd

from ablate.analysis.table import COST_COLUMNS, trials_frame
from ablate.harness import artifacts
from ablate.harness.artifacts import AttentionSample
from ablate.schema.spec import StudySpec
from ablate.schema.trials import EVAL, TUNE, optuna_study_name, trial_seed, trial_variant

PROVENANCE_ATTRS = ["hardware", "versions", "git_commit", "signatures", "fusion"]


@dataclass
class TrialArtifacts:
    history: list[dict[str, float]] = field(default_factory=list)  # rows of {step, val/..., train/...}
    per_length: list[dict[str, Any]] = field(default_factory=list)  # rows of {split, length, n, seq_acc}
    attention: list[AttentionSample] = field(default_factory=list)
    cost: dict[str, float] = field(default_factory=dict)  # tokens_per_sec, peak_mem_mb, steps
    translations: list[dict[str, Any]] = field(default_factory=list)  # rows of {split, src_len, hyp, ref}


@dataclass
class StudyData:
    spec: StudySpec
    trials: pd.DataFrame  # one row per eval trial, see trials_frame
    history: pd.DataFrame  # long: trial, variant, seed, step, one column per logged scalar
    per_length: pd.DataFrame  # long: trial, variant, seed, split, length, n, seq_acc
    attention: dict[int, list[AttentionSample]]  # trial number -> its probe samples
    tune: dict[str, list[optuna.trial.FrozenTrial]]  # variant -> its tune trials
    recorded: dict[str, list[str]]  # see recorded_provenance
    configs: dict[int, dict[str, Any]]  # trial number -> its flat config
    # Text tasks, long: trial, variant, seed, split, src_len, hyp, ref; a trial's rows in its splits' order.
    translations: pd.DataFrame = field(default_factory=pd.DataFrame)


def eval_trials(spec: StudySpec, storage) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=optuna_study_name(spec), storage=storage)
    return study.get_trials(deepcopy=False)


def read_artifacts(
    t: optuna.trial.FrozenTrial, spec: StudySpec, runs_root: str | Path, store=None
) -> TrialArtifacts:
    """A trial's metrics file (history, per_length), attention samples and translations, from its own folder
    (harness.artifacts.trial_dir), else from `store` (the 'artifacts' user attr maps each path to its artifact
    id; None: no store); whatever is missing stays empty, checkpoints are left alone."""
    files: dict[str, Path] = {}
    folder = artifacts.trial_dir(artifacts.study_dir(spec.slug, runs_root), EVAL, t.number)
    if folder.is_dir():
        files.update({p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if _wanted(p.name)})
    with tempfile.TemporaryDirectory(prefix="report-artifacts-") as scratch:
        if store is not None:
            for rel, artifact_id in t.user_attrs.get("artifacts", {}).items():
                if rel in files or not _wanted(Path(rel).name):
                    continue
                path = Path(scratch) / artifact_id
                try:
                    optuna.artifacts.download_artifact(
                        artifact_store=store, artifact_id=artifact_id, file_path=str(path)
                    )
                except (OSError, optuna.artifacts.exceptions.ArtifactNotFound):
                    continue  # the record outlived its file: render what exists
                files[rel] = path
        return _parse_artifacts({Path(rel).name: path for rel, path in files.items()})


def _wanted(name: str) -> bool:
    return name in (artifacts.METRICS, artifacts.TRANSLATIONS) or name.endswith(".npz")


def _parse_artifacts(files: dict[str, Path]) -> TrialArtifacts:
    out = TrialArtifacts()
    if artifacts.METRICS in files:
        try:
            result = json.loads(files[artifacts.METRICS].read_text())
        except (OSError, ValueError):
            result = {}  # unreadable: the trial draws no curve
        out.history = result.get("history") or []
        out.per_length = result.get("per_length") or []
        out.cost = {k: result[k] for k in COST_COLUMNS if isinstance(result.get(k), (int, float))}
    if artifacts.TRANSLATIONS in files:
        try:
            out.translations = artifacts.read_jsonl(files[artifacts.TRANSLATIONS])
        except (OSError, ValueError):
            pass  # unreadable: the trial draws no BLEU by length
    for name in sorted(n for n in files if n.endswith(".npz")):
        try:
            out.attention.append(AttentionSample.load(files[name]))
        except (OSError, KeyError, ValueError):
            continue
    return out


def open_artifact_store(spec: StudySpec, runs_root: str | Path, location: str | None):
    """The study's artifact store: the bucket `location` names, or its folder if that exists."""
    if location is None and not artifacts.artifact_dir(spec.slug, runs_root).is_dir():
        return None
    return artifacts.artifact_store(spec.slug, runs_root, location)


def collect(
    spec: StudySpec, storage, runs_root: str | Path = "runs", artifact_location: str | None = None
) -> StudyData:
    trials = eval_trials(spec, storage)
    store = open_artifact_store(spec, runs_root, artifact_location)
    df = trials_frame(spec, trials)
    history, per_length, translations, attention = [], [], [], {}
    for t in trials:
        if t.state != optuna.trial.TrialState.COMPLETE:
            continue
        variant, seed = trial_variant(t), trial_seed(t)
        art = read_artifacts(t, spec, runs_root, store)
        key = {"trial": t.number, "variant": variant, "seed": seed}
        history += [{**key, **row} for row in art.history]
        per_length += [{**key, **row} for row in art.per_length]
        translations += [{**key, **row} for row in art.translations]
        if art.attention:
            attention[t.number] = art.attention
        row = df.index[df["trial"] == t.number]
        for column, value in art.cost.items():
            if df.loc[row, column].isna().all():
                df.loc[row, column] = value
    return StudyData(
        spec=spec, trials=df, history=pd.DataFrame(history), per_length=pd.DataFrame(per_length),
        attention=attention, tune=tune_trials(spec, storage), recorded=recorded_provenance(trials),
        configs={t.number: t.user_attrs["config"] for t in trials if "config" in t.user_attrs},
        translations=pd.DataFrame(translations),
    )  # fmt: skip


def tune_trials(spec: StudySpec, storage) -> dict[str, list[optuna.trial.FrozenTrial]]:
    """Completed tune trials by variant, from the studies '<study>:tune:<variant>' or '<study>:tune'; the
    variant is the trial's 'variant' param or user attribute, else its study's, else 'all'."""
    prefix = optuna_study_name(spec, TUNE)
    out: dict[str, list] = {}
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        name = summary.study_name
        if name != prefix and not name.startswith(f"{prefix}:"):
            continue
        study = optuna.load_study(study_name=name, storage=storage)
        default = name.removeprefix(f"{prefix}:") if name != prefix else "all"
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            variant = t.params.get("variant") or t.user_attrs.get("variant") or default
            out.setdefault(str(variant), []).append(t)
    return out


def recorded_provenance(trials: list[optuna.trial.FrozenTrial]) -> dict[str, list[str]]:
    """The distinct values of what trials recorded about where and how they ran: user attributes
    'hardware', 'versions', 'git_commit', 'signatures' (sacreBLEU's; strings or dicts) and 'fusion' (whether
    the eval seeds trained fused, or why alone)."""
    def distinct(key: str) -> list[str]:
        values = [t.user_attrs.get(key) for t in trials]
        return sorted({json.dumps(v, sort_keys=True) if isinstance(v, dict) else str(v) for v in values if v})

    return {key: distinct(key) for key in PROVENANCE_ATTRS}
