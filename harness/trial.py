"""One trial: ExperimentConfig -> data -> Seq2SeqModule -> Trainer.fit -> test metrics + artifacts.

Training keeps the checkpoint with the best val/loss (and writes the last one); the test splits are
decoded with that best checkpoint, loaded with weights_only=True. With `out_dir` the trial leaves its
config, metrics (metrics, history, per-length accuracy, cost), checkpoints, attention samples and data
there, as harness.artifacts names them."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import resource
import shutil
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, RichProgressBar
from lightning.pytorch.loggers import WandbLogger

from harness import artifacts
from harness.artifacts import AttentionSample
from harness.config import ConfigError, ExperimentConfig
from harness.metrics import accuracy_by_length, alignment_error_rate, text_metrics
from harness.probes import Probe, capture, log_images, select_probes
from harness.tasks import TaskData, build_task
from harness.tasks.datamodule import Seq2SeqDataModule
from models.decoding import generation_budget
from models.diagnostics import rank_collapse
from models.module import PAD_ID, Seq2SeqModule

MONITOR = "val/loss"  # what selects the best checkpoint and drives early stopping


def quiet_lightning() -> None:
    """Many trials in one process: Lightning's per-run notices (accelerators, tips, checkpoint restores)
    and its deprecation warnings would bury the one line a worker prints per trial."""
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", category=category, module="lightning")


@dataclass
class TrialResult:
    metrics: dict[str, float]
    params: int
    wall_time: float
    split_sizes: dict[str, int]
    history: list[dict[str, float]] = field(default_factory=list)
    # Accuracy by target length (tokens without EOS): rows of {split, length, n, seq_acc, tok_acc}.
    per_length: list[dict[str, Any]] = field(default_factory=list)
    attention: list[AttentionSample] = field(default_factory=list)
    tokens_per_sec: float = 0.0  # training throughput, target + source tokens without padding
    peak_mem_mb: float = 0.0  # peak CUDA memory allocated, or the process's peak RSS while training on CPU
    steps: int = 0
    padding_fraction: float = 0.0  # share of padding in one epoch of training batches

    def summary(self) -> dict[str, Any]:
        """The flat JSON object `ablate train --json` prints."""
        return {**self.metrics, "params": self.params, "wall_time": round(self.wall_time, 3),
                "steps": self.steps, "tokens_per_sec": round(self.tokens_per_sec, 1),
                "peak_mem_mb": round(self.peak_mem_mb, 1), "padding_fraction": round(self.padding_fraction, 4),
                "split_sizes": self.split_sizes}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """Everything but the attention arrays (those are .npz files)."""
        return {k: v for k, v in asdict(self).items() if k != "attention"}


class HistoryCallback(L.Callback):
    """Keeps every logged scalar by step, so learning curves survive without any external logger."""

    def __init__(self):
        self.rows: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            row = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
            self.rows.append({"step": trainer.global_step, **row})


def reset_peak_rss() -> None:
    """Restarts the kernel's peak-RSS count (Linux), so a long-lived worker reports each trial's own peak
    rather than the largest of all it ran."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_rss_mb() -> float:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):  # "VmHWM:   123456 kB"
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # never reset; KiB on Linux


class CostMonitor(L.Callback):
    """Training throughput in tokens per second and peak memory.

    Tokens are counted on the device and read back once per logging interval (or validation), so
    counting adds no per-step sync; validation time is excluded from the throughput."""

    def __init__(self):
        self.tokens, self.train_seconds, self.peak_mem_mb = 0, 0.0, 0.0
        self._window_tokens: torch.Tensor | int = 0
        self._window_start = 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)
        else:
            reset_peak_rss()
        self._window_start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        real = (batch["src"] != PAD_ID).sum() + (batch["tgt_out"] != PAD_ID).sum()
        self._window_tokens = self._window_tokens + real
        if trainer.loggers and trainer.global_step % trainer.log_every_n_steps == 0:
            rate = self._close_window()
            for logger in trainer.loggers:
                logger.log_metrics({"train/tokens_per_sec": rate}, step=trainer.global_step)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_window()

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._window_start = time.perf_counter()

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._close_window()
        if pl_module.device.type == "cuda":
            self.peak_mem_mb = torch.cuda.max_memory_allocated(pl_module.device) / 2**20
        else:
            self.peak_mem_mb = peak_rss_mb()

    def _close_window(self) -> float:
        tokens = int(self._window_tokens)
        seconds = time.perf_counter() - self._window_start
        self.tokens, self.train_seconds = self.tokens + tokens, self.train_seconds + seconds
        self._window_tokens, self._window_start = 0, time.perf_counter()
        return tokens / max(seconds, 1e-9)

    @property
    def tokens_per_sec(self) -> float:
        return self.tokens / max(self.train_seconds, 1e-9)


class ValidateOnStop(L.Callback):
    """Ends training on a validation: Lightning validates when asked to stop, so the weights of the last
    step (max_steps reached mid-interval) are scored and can become the best checkpoint."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True


class AttentionImages(L.Callback):
    """Logs the probes' attention heatmaps to W&B after every validation, to watch alignments form."""

    def __init__(self, probes: list[Probe]):
        self.probes = probes

    def on_validation_end(self, trainer: L.Trainer, pl_module: Seq2SeqModule) -> None:
        if not trainer.sanity_checking and any(isinstance(lg, WandbLogger) for lg in trainer.loggers):
            log_images(trainer.loggers, capture(pl_module, self.probes), trainer.global_step)


def resolve_precision(precision: str) -> str:
    if precision != "auto":
        return precision
    return "bf16-mixed" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "32-true"


def check_positions(cfg: ExperimentConfig, data: TaskData) -> None:
    """Learned positions and location attention stop at model.max_positions: say so before training,
    not in the test after it."""
    m = cfg.model
    longest_source = 1 + max(len(ex.src) for examples in data.splits.values() for ex in examples)  # + EOS
    if m.arch == "transformer" and m.pos_encoding == "learned":
        needed = generation_budget(longest_source, data.train_max_len)
        reach = f"decoding may run to {needed} positions (sources of up to {longest_source} tokens)"
    elif m.arch != "transformer" and m.attention == "location":
        needed, reach = longest_source, f"sources reach {longest_source} tokens"
    else:
        return
    if needed > m.max_positions:
        raise ConfigError(
            f"model.max_positions: {m.max_positions} is too short for {cfg.task.name}: {reach}; "
            f"set it to at least {needed}"
        )


def build_module(cfg: ExperimentConfig, data: TaskData, eval_splits: list[str]) -> Seq2SeqModule:
    t = cfg.train
    return Seq2SeqModule(
        cfg.model, len(data.src_vocab), len(data.tgt_vocab), lr=t.lr, weight_decay=t.weight_decay, schedule=t.schedule,
        warmup_steps=t.warmup_steps, max_steps=t.max_steps, label_smoothing=t.label_smoothing,
        beam_size=t.beam_size, length_penalty=t.length_penalty, compile=t.compile,
        eval_splits=tuple(eval_splits), train_max_len=data.train_max_len,
    )  # fmt: skip


def generation_metrics(
    module: Seq2SeqModule, data: TaskData
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """BLEU / chrF per test split for text tasks, and exact match by target length for every task."""
    metrics, per_length = {}, []
    for split, rows in module.predictions.items():
        metrics.update(text_metrics(split, rows, data))
        for row in accuracy_by_length(rows):
            per_length.append({"split": split, "length": row["length_min"], "n": row["n"],
                               "seq_acc": row["seq_acc"], "tok_acc": row["tok_acc"]})  # fmt: skip
    return metrics, per_length


def alignment_metrics(module: Seq2SeqModule, dm: Seq2SeqDataModule, data: TaskData) -> dict[str, float]:
    """AER of the last cross-attention layer (mean over heads) against the gold alignments, for each
    evaluation split whose examples carry them. Models without attention have no AER."""
    metrics = {}
    for split, loader in zip(dm.eval_splits, dm.test_dataloader()):
        examples = data.splits[split]
        if any(ex.alignment is None for ex in examples):
            continue
        attentions = []
        for batch in loader:  # evaluation loaders keep the split's order
            cross = module.attention(batch["src"].to(module.device), batch["tgt_in"].to(module.device)).get(
                "cross"
            )
            if not cross or cross[-1] is None:
                return metrics
            attentions.extend(cross[-1].float().mean(1).cpu())  # (B, H, T, S) -> B x (T, S)
        sizes = [(len(ex.src), len(ex.tgt)) for ex in examples]
        metrics[f"{split}/aer"] = alignment_error_rate(attentions, [ex.alignment for ex in examples], sizes)
    return metrics


def rank_collapse_metrics(module: Seq2SeqModule, dm: Seq2SeqDataModule) -> dict[str, float]:
    """Rank collapse (Dong et al. 2021, models/diagnostics.py) of the last encoder and decoder layer's
    output on each evaluation split, mean over its sequences: 0 when every token became the same vector.
    Transformers only: the recurrent family has no layer outputs of that kind."""
    if not hasattr(module.model, "hidden_states"):
        return {}
    metrics = {}
    with module._inference():
        for split, loader in zip(dm.eval_splits, dm.test_dataloader()):
            sums: dict[str, float] = {}
            count = 0
            for batch in loader:
                src, tgt_in = batch["src"].to(module.device), batch["tgt_in"].to(module.device)
                masks = {"encoder": src != PAD_ID, "decoder": tgt_in != PAD_ID}
                for side, states in module.model.hidden_states(src, tgt_in).items():
                    if states:  # no encoder layers without cross-attention
                        value = float(rank_collapse(states[-1].float(), masks[side]).sum())
                        sums[side] = sums.get(side, 0.0) + value
                count += src.size(0)
            metrics.update({f"{split}/rank_collapse_{side}": total / count for side, total in sums.items()})
    return metrics


def log_final(loggers: list, result: TrialResult, step: int) -> None:
    """Cost figures as metrics and the per-length table as a W&B table."""
    cost = {"cost/params": result.params, "cost/wall_time": result.wall_time,
            "cost/tokens_per_sec": result.tokens_per_sec, "cost/peak_mem_mb": result.peak_mem_mb}  # fmt: skip
    for logger in loggers:
        logger.log_metrics(cost, step=step)
        if isinstance(logger, WandbLogger) and result.per_length:
            columns = list(result.per_length[0])
            logger.log_table("per_length", columns, [[row[c] for c in columns] for row in result.per_length],
                             step=step)  # fmt: skip
        logger.save()


class StepBudgetProgressBar(RichProgressBar):
    """Rich's bar, without the "Epoch 3/-2" it shows when a run is bounded by steps (max_epochs -1)."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        return f"Epoch {current_epoch}".ljust(len(self.validation_description))  # as wide: no flicker


def build_trainer(
    cfg: ExperimentConfig, callbacks: list, loggers: list, progress: bool, steps_per_epoch: int, root: str
) -> L.Trainer:
    """The Trainer for the train.* budgets: validation every val_every steps (at most once an epoch),
    or once an epoch when max_epochs is set."""
    t = cfg.train
    if t.patience is not None:
        callbacks = [*callbacks, EarlyStopping(MONITOR, patience=t.patience, check_on_train_epoch_end=False)]
    if progress:
        callbacks = [*callbacks, StepBudgetProgressBar()]
    by_steps = t.max_epochs is None
    return L.Trainer(
        max_steps=t.max_steps,
        max_epochs=-1 if by_steps else t.max_epochs,
        max_time={"seconds": t.max_time} if t.max_time else None,
        val_check_interval=min(t.val_every, max(1, steps_per_epoch)) if by_steps else None,
        check_val_every_n_epoch=None if by_steps else 1,
        gradient_clip_val=t.grad_clip,
        precision=resolve_precision(t.precision),
        deterministic=t.deterministic,
        accelerator="auto",
        devices=1,
        logger=loggers or False,
        callbacks=callbacks,
        log_every_n_steps=min(50, t.val_every),
        enable_progress_bar=progress,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
    )


def best_validation(rows: list[dict[str, float]]) -> dict[str, float]:
    """val/* of the validation with the lowest val/loss (the best checkpoint's); NaN never wins."""
    scored = [row for row in rows if MONITOR in row]
    if not scored:
        return {}
    best = min(scored, key=lambda row: (math.isnan(row[MONITOR]), row[MONITOR]))
    return {k: v for k, v in best.items() if k.startswith("val/")}


def run_trial(
    cfg: ExperimentConfig,
    out_dir: str | Path | None = None,
    loggers: list | None = None,
    callbacks: list | None = None,
    progress: bool = False,
) -> TrialResult:
    """Trains and tests one configuration; with `out_dir`, leaves its artifacts there."""
    start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    data = build_task(cfg.task, cfg.seed)
    check_positions(cfg, data)
    dm = Seq2SeqDataModule(data, cfg.train.batch_size, cfg.seed, batch_tokens=cfg.train.batch_tokens)
    module = build_module(cfg, data, dm.eval_splits)
    probes = select_probes(data)
    loggers = list(loggers or [])
    history, cost = HistoryCallback(), CostMonitor()
    with tempfile.TemporaryDirectory(prefix="trial-ckpt-") as scratch:
        # Without an out_dir the best checkpoint still selects the tested weights; it lives in scratch.
        ckpt_dir = Path(out_dir) / artifacts.CHECKPOINTS if out_dir is not None else Path(scratch)
        best = ModelCheckpoint(
            dirpath=ckpt_dir,
            filename=artifacts.BEST_CHECKPOINT,
            monitor=MONITOR,
            enable_version_counter=False,
        )
        own = [history, cost, best, ValidateOnStop(), AttentionImages(probes)]
        root = str(out_dir) if out_dir is not None else scratch
        trainer = build_trainer(
            cfg, [*own, *(callbacks or [])], loggers, progress, len(dm.train_dataloader()), root
        )
        trainer.fit(module, datamodule=dm)
        # The full state (optimizer, schedule, loops), not only the weights: the last checkpoint can resume.
        trainer.save_checkpoint(ckpt_dir / artifacts.LAST_CHECKPOINT, weights_only=False)
        tested = best.best_model_path or str(ckpt_dir / artifacts.LAST_CHECKPOINT)
        test_metrics = trainer.test(module, datamodule=dm, ckpt_path=tested, verbose=False, weights_only=True)

    metrics, per_length = generation_metrics(module, data)
    for per_loader in test_metrics:
        metrics.update({k: float(v) for k, v in per_loader.items()})
    metrics.update(best_validation(history.rows))
    metrics.update(alignment_metrics(module, dm, data))
    metrics.update(rank_collapse_metrics(module, dm))
    result = TrialResult(
        metrics=dict(sorted(metrics.items())),
        params=module.num_parameters(),
        wall_time=time.perf_counter() - start,
        split_sizes=data.sizes(),
        history=history.rows,
        per_length=per_length,
        attention=capture(module, probes),
        tokens_per_sec=cost.tokens_per_sec,
        peak_mem_mb=cost.peak_mem_mb,
        steps=trainer.global_step,
        padding_fraction=dm.padding_fraction("train"),
    )
    log_images(loggers, result.attention, trainer.global_step)
    log_final(loggers, result, trainer.global_step)
    if out_dir is not None:
        write_artifacts(Path(out_dir), cfg, result, loggers)
        # Vocabularies and tokenizers: what reads this run's outputs.
        data.save(Path(out_dir) / artifacts.DATA)
    return result


def write_artifacts(out: Path, cfg: ExperimentConfig, result: TrialResult, loggers: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / artifacts.CONFIG).write_text(json.dumps(cfg.model_dump(), indent=2))
    (out / artifacts.METRICS).write_text(json.dumps(result.to_json(), indent=2))
    attention_dir = out / artifacts.ATTENTION
    attention_dir.mkdir(exist_ok=True)
    for i, sample in enumerate(result.attention):
        sample.save(out / artifacts.attention_file(i, sample.split))
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            # The arrays travel with the W&B run too, next to the heatmap images: what lies in the run's
            # own folder is uploaded when it finishes (or by `wandb sync`), without wandb.save's
            # per-file symlink warnings.
            shutil.copytree(
                attention_dir, Path(logger.experiment.dir) / artifacts.ATTENTION, dirs_exist_ok=True
            )
