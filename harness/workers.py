"""Worker loop: claim a grid point (variant x seed), run its trial, store metrics and artifacts."""

from __future__ import annotations

import json
import math
import traceback
from pathlib import Path

import optuna

from harness import tracking
from harness.study import StudySpec, create_eval_study, study_dir
from harness.trial import run_trial


class TrialFailed(RuntimeError):
    """A trial that ran but produced no usable metric (e.g. it diverged)."""


def make_objective(spec: StudySpec, runs_root: str | Path, wandb_mode: tracking.WandbMode):
    variants = spec.variant_overrides()
    root = study_dir(spec, runs_root)

    def objective(trial: optuna.Trial) -> float:
        name = trial.suggest_categorical("variant", list(variants))
        seed = trial.suggest_categorical("seed", spec.seeds)
        overrides = variants[name]
        cfg = spec.config_for(overrides, seed)
        trial.set_user_attr("factors", overrides)
        trial.set_user_attr("config", cfg.flat())
        out_dir = root / "trials" / f"{trial.number:04d}"
        try:
            with tracking.wandb_logger(
                wandb_mode, root, group=spec.name, name=f"{name}-seed{seed}", job_type="eval",
                tags=[f"{k.rsplit('.', 1)[-1]}={v}" for k, v in overrides.items()], config=cfg.flat(),
            ) as logger:  # fmt: skip
                result = run_trial(cfg, out_dir=out_dir, loggers=[logger] if logger else None)
        except Exception as e:
            trial.set_user_attr("fail_reason", f"{type(e).__name__}: {e}"[:2000])
            trial.set_user_attr("traceback", traceback.format_exc()[-4000:])
            raise
        trial.set_user_attr("metrics", result.metrics)
        trial.set_user_attr("params", result.params)
        trial.set_user_attr("wall_time", result.wall_time)
        trial.set_user_attr("split_sizes", result.split_sizes)
        (out_dir / "history.json").write_text(json.dumps(result.history))
        value = result.metrics.get(spec.metric.name)
        if value is None or not math.isfinite(value):
            reason = f"metric {spec.metric.name} is {value!r}"
            trial.set_user_attr("fail_reason", reason)
            raise TrialFailed(reason)
        return value

    return objective


def run_worker(
    spec: StudySpec, storage, runs_root: str | Path = "runs", wandb_mode: tracking.WandbMode = "offline"
):
    """Runs grid points until none is left; failed trials are recorded and the sweep goes on."""
    study = create_eval_study(spec, storage)
    grid_size = len(spec.variant_overrides()) * len(spec.seeds)
    done = sum(t.state.is_finished() for t in study.trials)
    if done < grid_size:
        study.optimize(
            make_objective(spec, runs_root, wandb_mode), n_trials=grid_size - done, catch=(Exception,),
            gc_after_trial=True,
        )  # fmt: skip
    return study
