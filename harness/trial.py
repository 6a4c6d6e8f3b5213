"""One trial: ExperimentConfig -> data -> Seq2SeqModule -> Trainer.fit -> evaluation -> artifacts.

Training keeps the checkpoint with the best val/loss (and writes the last one), and every
train.checkpoint_every steps the full state a retried trial resumes from (harness.checkpoints); the test
splits are decoded once with the best checkpoint, loaded with weights_only=True, and every test metric
comes from that pass (harness/evaluation.py). With `out_dir` the trial leaves its
config, metrics (metrics, history, per-length accuracy, cost), checkpoints, attention samples, the test
sentences' translations (text tasks) and data there, as harness.artifacts names them."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.loggers import WandbLogger

from ablate.harness import artifacts, tracking
from ablate.harness.artifacts import AttentionSample
from ablate.harness.attention_maps import save_probe_image
from ablate.harness.callbacks import (
    AttentionImages,
    CostMonitor,
    DivergenceGuard,
    EarlyStop,
    HistoryCallback,
    StepBudgetProgressBar,
    ValidateOnStop,
)
from ablate.harness.checkpoints import BestCheckpoint, Checkpointer
from ablate.harness.evaluation import Evaluation
from ablate.harness.lengths import position_problem
from ablate.harness.probes import log_images, select_probes
from ablate.harness.rules import MONITOR, Best, Cost, Schedule
from ablate.harness.tasks import TaskData, build_task
from ablate.harness.tasks.datamodule import Seq2SeqDataModule
from ablate.models.diagnostics import at_initialisation
from ablate.models.kinds import FAMILIES
from ablate.models.module import Seq2SeqModule
from ablate.models.steps import compiles
from ablate.schema.config import ExperimentConfig
from ablate.schema.errors import ConfigError, RunFailed
from ablate.schema.tasks import TASKS


@dataclass
class TrialResult:
    metrics: dict[str, float]
    params: int
    wall_time: float
    split_sizes: dict[str, int]
    history: list[dict[str, float]] = field(default_factory=list)
    # Accuracy by target length (tokens without EOS): rows of {split, length, n, seq_acc, tok_acc, tokens}.
    per_length: list[dict[str, Any]] = field(default_factory=list)
    attention: list[AttentionSample] = field(default_factory=list)
    # Text tasks: rows of {split, src_len, hyp, ref} per test sentence (harness.metrics.translations).
    translations: list[dict[str, Any]] = field(default_factory=list)
    tokens_per_sec: float = 0.0  # training throughput, target + source tokens without padding
    peak_mem_mb: float = 0.0  # peak CUDA memory allocated, or the process's peak RSS while training on CPU
    steps: int = 0
    padding_fraction: float = 0.0  # share of padding in one epoch of training batches
    # How the text metrics were computed: sacreBLEU's signature by metric ("bleu", "chrf"), for text tasks.
    signatures: dict[str, str] = field(default_factory=dict)
    best_step: int | None = None  # the step of the validation whose checkpoint was tested
    resumed_from_step: int = 0  # the checkpoint's step a retried trial resumed from; 0: a fresh start

    def summary(self) -> dict[str, Any]:
        """The flat JSON object `ablate train --json` prints."""
        return {**self.metrics, "params": self.params, "wall_time": round(self.wall_time, 3),
                "steps": self.steps, "tokens_per_sec": round(self.tokens_per_sec, 1),
                "peak_mem_mb": round(self.peak_mem_mb, 1), "padding_fraction": round(self.padding_fraction, 4),
                "split_sizes": self.split_sizes}  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        """Everything but the attention arrays (those are .npz files) and the translations (a JSONL file)."""
        return {k: v for k, v in asdict(self).items() if k not in ("attention", "translations")}


def resolve_precision(precision: str) -> str:
    """`auto` is fp32 on every device. One precision for every variant of a study: chosen by width, a study
    that varies d_model would compare fp32 models with bf16 ones. And fp32 is the faster at the studies'
    sizes on a GPU too: a training step at batch 64 on an H100 took 15.8 ms in fp32 and 18.6 ms under bf16
    autocast at d_model 64, 16.7 and 25.6 ms at d_model 256. bf16-mixed is for wide models, asked for."""
    return "32-true" if precision == "auto" else precision


def data_module(cfg: ExperimentConfig, data: TaskData) -> Seq2SeqDataModule:
    """The trial's batches; lengths from a bounded set when its step compiles on the device it trains on
    (the Trainer's accelerator="auto")."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return Seq2SeqDataModule(
        data, cfg.train.batch_size, cfg.seed, batch_tokens=cfg.train.batch_tokens,
        bounded_lengths=compiles(cfg.train.compile, cfg.model, device),
    )  # fmt: skip


def build_module(cfg: ExperimentConfig, data: TaskData, eval_splits: list[str]) -> Seq2SeqModule:
    # Dropout from the trial seed's own generator: the masks seed k draws fused (harness/fused.py).
    return Seq2SeqModule(
        cfg.model, len(data.src_vocab), len(data.tgt_vocab), cfg.train, tuple(eval_splits), data.train_max_len,
        dropout_seed=cfg.seed,
    )  # fmt: skip


# The most source and target positions of the first batch that init/* metrics read: it runs on the CPU before
# training moves the model, so a GPU profile's batch (16 windows of 1024 tokens) is cut to its first examples.
INITIAL_POSITIONS = 8192


def initial_metrics(cfg: ExperimentConfig, dm: Seq2SeqDataModule, module: Seq2SeqModule) -> dict[str, float]:
    """A Transformer's init/* metrics (models/diagnostics.py at_initialisation) on its first training batch,
    as its first step will see it (its first INITIAL_POSITIONS positions' worth of examples); the same fused or
    alone, fresh or resumed (the model is rebuilt from its seed)."""
    if cfg.model.arch != "transformer":
        return {}
    first = [dm.encoded["train"][i] for i in dm.sampler("train", shuffle=True).batches(0)[0]]
    width = max(len(src) + len(tgt) for src, tgt in first)
    batch = dm.collate("train", first[: max(1, INITIAL_POSITIONS // width)])
    values = at_initialisation(module.model, batch, module.optim.label_smoothing)
    return {f"init/{name}": value for name, value in values.items()}


@dataclass
class Prepared:
    """What a trial trains and tests, built in the one order that fixes its initialisation: seeding, data,
    the model, the probes."""

    cfg: ExperimentConfig
    data: TaskData
    dm: Seq2SeqDataModule
    module: Seq2SeqModule
    probes: list
    initial: dict[str, float]  # init/* metrics: the model before its first step (initial_metrics)

    @classmethod
    def of(cls, cfg: ExperimentConfig) -> Prepared:
        L.seed_everything(cfg.seed, workers=True, verbose=False)
        data = build_task(cfg.task, cfg.seed)
        problem = position_problem(cfg, data)
        if problem is not None:
            raise ConfigError(": ".join(problem))
        dm = data_module(cfg, data)
        module = build_module(cfg, data, dm.eval_splits)
        return cls(cfg, data, dm, module, select_probes(data), initial_metrics(cfg, dm, module))

    def evaluation(self) -> Evaluation:
        return Evaluation(
            self.data, self.dm.eval_splits, self.probes, FAMILIES[self.cfg.model.arch].classifies,
            TASKS[self.cfg.task.name].labelled,
        )  # fmt: skip

    def result(
        self, steps: int, test_metrics: list[dict], evaluation: Evaluation, history: list[dict],
        cost: Cost, start: float, resumed_from_step: int,
    ) -> TrialResult:  # fmt: skip
        """The TrialResult of a trial trained `steps` steps and tested: `test_metrics` and `evaluation` from its
        test pass, `history` its validations; `cost` the training's (tokens_per_sec, peak_mem_mb)."""
        metrics = {k: float(v) for per_loader in test_metrics for k, v in per_loader.items()}
        metrics.update(self.initial)
        metrics.update(evaluation.metrics())
        best_val = best_validation(history)
        metrics.update({k: v for k, v in best_val.items() if k != "step"})
        return TrialResult(
            metrics=dict(sorted(metrics.items())),
            signatures=evaluation.signatures(),
            best_step=best_val.get("step"),
            params=self.module.num_parameters(),
            wall_time=time.perf_counter() - start,
            split_sizes=self.data.sizes(),
            history=history,
            per_length=evaluation.per_length(),
            attention=evaluation.attention(),
            translations=evaluation.translations(),
            tokens_per_sec=cost.tokens_per_sec,
            peak_mem_mb=cost.peak_mem_mb,
            steps=steps,
            padding_fraction=self.dm.padding_fraction("train"),
            resumed_from_step=resumed_from_step,
        )

    def leave(self, result: TrialResult, out_dir: str | Path | None, loggers: list, step: int) -> None:
        """Logs the result's images and cost, and with `out_dir` writes its artifacts and data there."""
        log_images(loggers, result.attention, step)
        # Cost figures as metrics; for W&B the per-length table and the summary.
        cost = {"cost/params": result.params, "cost/wall_time": result.wall_time,
                "cost/tokens_per_sec": result.tokens_per_sec, "cost/peak_mem_mb": result.peak_mem_mb}  # fmt: skip
        for logger in loggers:
            logger.log_metrics(cost, step=step)
            if isinstance(logger, WandbLogger):
                if result.per_length:
                    columns = list(result.per_length[0])
                    rows = [[row[c] for c in columns] for row in result.per_length]
                    logger.log_table("per_length", columns, rows, step=step)
                tracking.record_summary(logger.experiment, result.metrics, result.best_step)
            logger.save()
        if out_dir is not None:
            write_artifacts(Path(out_dir), self.cfg, result, loggers)
            # Vocabularies and tokenizers: what reads this run's outputs.
            self.data.save(Path(out_dir) / artifacts.DATA)


def build_trainer(
    cfg: ExperimentConfig, callbacks: list, loggers: list, progress: bool, root: str
) -> L.Trainer:
    """The Trainer for the train.* budgets and cadences (rules.Schedule)."""
    t = cfg.train
    if t.patience is not None:
        callbacks = [*callbacks, EarlyStop(t.patience)]
    if progress:
        callbacks = [*callbacks, StepBudgetProgressBar()]
    return L.Trainer(
        **Schedule(t).trainer_args(),
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
        # The test pass runs under no_grad, not inference mode: a classifier's explanation measures take
        # gradients of its outputs (models/explanation.py).
        inference_mode=False,
        enable_checkpointing=False,  # the best weights are BestCheckpoint's (rules.Best)
        default_root_dir=root,
        # One process, one device, whatever the scheduler: inside a SLURM job Lightning would otherwise read
        # SLURM_NTASKS as a world size (and refuse K workers of one `srun -n K`) and install its own SIGUSR1
        # requeue beside the harness's (harness.signals, harness.launchers.slurm).
        plugins=[LightningEnvironment()],
    )


def best_validation(rows: list[dict[str, float]]) -> dict[str, float]:
    """step and val/* of the validation whose weights were tested (rules.Best over the history)."""
    best, chosen = Best(), {}
    for row in rows:
        if MONITOR in row and best.improves(row[MONITOR], int(row["step"])):
            chosen = row
    return {k: v for k, v in chosen.items() if k.startswith("val/") or k == "step"}


def run_trial(
    cfg: ExperimentConfig,
    out_dir: str | Path | None = None,
    loggers: list | None = None,
    callbacks: list | None = None,
    progress: bool = False,
    resume_from: Path | None = None,
    publish: Callable[[Path, int], None] | None = None,
) -> TrialResult:
    """Trains and tests one configuration; with `out_dir`, leaves its artifacts there. `resume_from`: a
    resume checkpoint to continue (its best-so-far copy already in out_dir's checkpoints); `publish` gets
    each new resume checkpoint's folder and step (a worker stores it for retries elsewhere)."""
    start = time.perf_counter()
    prepared = Prepared.of(cfg)
    dm, module, probes = prepared.dm, prepared.module, prepared.probes
    loggers = list(loggers or [])
    history, cost = HistoryCallback(), CostMonitor()
    evaluation = prepared.evaluation()
    with tempfile.TemporaryDirectory(prefix="trial-ckpt-") as scratch:
        # Without an out_dir the best checkpoint still selects the tested weights; it lives in scratch.
        ckpt_dir = Path(out_dir) / artifacts.CHECKPOINTS if out_dir is not None else Path(scratch)
        best = BestCheckpoint(ckpt_dir)
        periodic = Checkpointer(ckpt_dir, Schedule(cfg.train), publish)
        # DivergenceGuard first: a NaN model is neither validated, checkpointed as the best nor tested.
        own = [DivergenceGuard(), history, cost, best, periodic, ValidateOnStop(), AttentionImages(probes),
               evaluation]  # fmt: skip
        root = str(out_dir) if out_dir is not None else scratch
        trainer = build_trainer(cfg, [*own, *(callbacks or [])], loggers, progress, root)
        trainer.fit(module, datamodule=dm, ckpt_path=resume_from, weights_only=True)
        if trainer.global_step == 0:  # an untrained model's scores would be ranked like a trained one's
            budget = f" within train.max_time={cfg.train.max_time} s" if cfg.train.max_time else ""
            raise RunFailed(f"no optimizer step ran{budget}; the trial reports nothing")
        if not cfg.train.keep_checkpoints:
            (ckpt_dir / artifacts.RESUME_CHECKPOINT).unlink(missing_ok=True)
        # The full state (optimizer, schedule, loops), not only the weights: the last checkpoint can resume.
        trainer.save_checkpoint(ckpt_dir / artifacts.LAST_CHECKPOINT, weights_only=False)
        tested = best.best_model_path or str(ckpt_dir / artifacts.LAST_CHECKPOINT)
        test_metrics = trainer.test(module, datamodule=dm, ckpt_path=tested, verbose=False, weights_only=True)

    result = prepared.result(
        trainer.global_step, test_metrics, evaluation, history.rows, cost.cost, start,
        periodic.resumed_from_step,
    )  # fmt: skip
    prepared.leave(result, out_dir, loggers, trainer.global_step)
    return result


def write_artifacts(out: Path, cfg: ExperimentConfig, result: TrialResult, loggers: list) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / artifacts.CONFIG).write_text(json.dumps(cfg.model_dump(), indent=2))
    (out / artifacts.METRICS).write_text(json.dumps(result.to_json(), indent=2))
    if result.translations:
        artifacts.write_jsonl(out / artifacts.TRANSLATIONS, result.translations)
    attention_dir = out / artifacts.ATTENTION
    attention_dir.mkdir(exist_ok=True)
    for i, sample in enumerate(result.attention):
        sample.save(out / artifacts.attention_file(i, sample.split))
        save_probe_image(sample, out / artifacts.attention_file(i, sample.split, ".png"))
    for logger in loggers:
        if isinstance(logger, WandbLogger):
            # The arrays travel with the W&B run too, next to the heatmap images: what lies in the run's
            # own folder is uploaded when it finishes (or by `wandb sync`), without wandb.save's
            # per-file symlink warnings.
            shutil.copytree(
                attention_dir, Path(logger.experiment.dir) / artifacts.ATTENTION, dirs_exist_ok=True
            )
