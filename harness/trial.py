"""One trial: ExperimentConfig -> data -> Seq2SeqModule -> Trainer.fit -> test metrics + artifacts."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L

from harness.config import ExperimentConfig
from harness.tasks import build_task
from harness.tasks.datamodule import Seq2SeqDataModule
from models.module import Seq2SeqModule


@dataclass
class TrialResult:
    metrics: dict[str, float]
    params: int
    wall_time: float
    split_sizes: dict[str, int]
    history: list[dict[str, float]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The flat JSON object `ablate train --json` prints."""
        return {**self.metrics, "params": self.params, "wall_time": round(self.wall_time, 3),
                "split_sizes": self.split_sizes}  # fmt: skip


class HistoryCallback(L.Callback):
    """Keeps every logged scalar by step, so learning curves survive without any external logger."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def _record(self, trainer: L.Trainer) -> None:
        row = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        self.rows.append({"step": trainer.global_step, **row})

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._record(trainer)


def build_module(cfg: ExperimentConfig, data_sizes: tuple[int, int], eval_splits: list[str]) -> Seq2SeqModule:
    t = cfg.train
    return Seq2SeqModule(
        cfg.model, *data_sizes, lr=t.lr, weight_decay=t.weight_decay, schedule=t.schedule,
        warmup_steps=t.warmup_steps, max_steps=t.max_steps, label_smoothing=t.label_smoothing,
        eval_splits=tuple(eval_splits),
    )  # fmt: skip


def run_trial(
    cfg: ExperimentConfig,
    out_dir: str | Path | None = None,
    loggers: list | None = None,
    callbacks: list | None = None,
    progress: bool = False,
) -> TrialResult:
    """Trains and tests one configuration. With `out_dir`, writes config.json and metrics.json there."""
    start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    data = build_task(cfg.task, cfg.seed)
    dm = Seq2SeqDataModule(data, cfg.train.batch_size, cfg.seed)
    module = build_module(cfg, (len(data.src_vocab), len(data.tgt_vocab)), dm.eval_splits)
    history = HistoryCallback()
    t = cfg.train
    trainer = L.Trainer(
        max_steps=t.max_steps,
        max_epochs=t.max_epochs if t.max_epochs is not None else -1,
        max_time={"seconds": t.max_time} if t.max_time else None,
        val_check_interval=min(t.val_every, max(1, len(dm.train_dataloader())))
        if t.max_epochs is None
        else None,
        check_val_every_n_epoch=None if t.max_epochs is None else 1,
        gradient_clip_val=t.grad_clip,
        precision=t.precision,
        deterministic=t.deterministic,
        accelerator="auto",
        devices=1,
        logger=loggers or False,
        callbacks=[history, *(callbacks or [])],
        enable_checkpointing=False,
        enable_progress_bar=progress,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(out_dir) if out_dir else None,
    )
    trainer.fit(module, datamodule=dm)
    test_metrics = trainer.test(module, datamodule=dm, verbose=False)
    metrics: dict[str, float] = {}
    for per_loader in test_metrics:
        metrics.update({k: float(v) for k, v in per_loader.items()})
    metrics.update(
        {k: v for k, v in history.rows[-1].items() if k.startswith("val/")} if history.rows else {}
    )
    result = TrialResult(
        metrics=dict(sorted(metrics.items())),
        params=module.num_parameters(),
        wall_time=time.perf_counter() - start,
        split_sizes=data.sizes(),
        history=history.rows,
    )
    if out_dir is not None:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg.model_dump(), indent=2))
        (out / "metrics.json").write_text(json.dumps(asdict(result), indent=2))
    return result
