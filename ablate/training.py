"""One configuration trained and tested, for `ablate train` and `ablate.train` alike: its output folder and
W&B mode checked first, then one W&B run logged as a sweep trial logs it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ablate.harness.trial import TrialResult
    from ablate.schema.config import ExperimentConfig


def train_config(
    cfg: ExperimentConfig,
    *,
    config_file: str | Path | None,
    preset: str | None,
    overrides: dict[str, Any],
    out: Path | None,
    wandb: str | None,
    progress: bool,
) -> TrialResult:
    """Trains and tests `cfg` (built from `config_file`, `preset` and `overrides`, which name and tag its
    W&B run); with `out`, leaves its artifacts there. ConfigError before training for a bad `out`/`wandb`."""
    from ablate.harness import tracking
    from ablate.harness.study.validate import raise_problems, run_problems

    # A W&B sweep agent (which sets WANDB_SWEEP_ID) runs `ablate train key=value ...` and expects a run.
    requested = wandb if wandb or os.environ.get("WANDB_SWEEP_ID") else "disabled"
    raise_problems("", [], run_problems(out=out, wandb=requested))
    mode = tracking.resolve_mode(requested)  # type: ignore[arg-type]
    from ablate.harness.trial import run_trial

    label = preset or (Path(config_file).stem if config_file else cfg.model.arch)
    with tracking.wandb_logger(
        mode, (out or Path("runs") / "train").resolve(), group=label, name=f"{label}-seed{cfg.seed}",
        job_type="train", tags=tracking.run_tags(overrides), config=cfg.flat(),
    ) as logger:  # fmt: skip
        return run_trial(cfg, out_dir=out, loggers=[logger] if logger else None, progress=progress)
