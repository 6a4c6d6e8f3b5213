"""Seq2SeqModule: one LightningModule that trains and evaluates every model family.

Training minimises teacher-forced, label-smoothed cross entropy over non-padding target tokens with
AdamW and a step-wise lr schedule. Validation decodes greedily (cheap, for model selection); test
decodes with `beam_size`. Every evaluated split logs loss, perplexity, exact match and token accuracy.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import lightning as L
import torch

from ablate.models import build_model
from ablate.models.config import ModelConfig
from ablate.models.decoding import beam_search, greedy_decode, max_target_length
from ablate.models.ensemble import seed_dropout
from ablate.models.explanation import explain
from ablate.models.kinds import FAMILIES
from ablate.models.optim import SCHEDULES, OptimConfig
from ablate.models.sequences import BOS_ID, EOS_ID, IMAGE_ROWS, PAD_ID, score
from ablate.models.steps import Steps, loss_sums, summed_losses, training_loss


def lr_lambda(schedule: str, warmup_steps: int, max_steps: int):
    """Multiplier on the base lr at a given step (LambdaLR): the schedule SCHEDULES names `schedule`."""
    multiplier, warmup = SCHEDULES[schedule], max(warmup_steps, 0)

    # A function, not a partial: LambdaLR's checkpoints keep a callable object's attributes, a function's none.
    def at(step: int) -> float:
        return multiplier(step, warmup, max_steps)

    return at


# The examples of each test split a classifier's explanation measures read (models/explanation.py): each
# costs a forward pass per token (leave-one-out) and an adversarial search.
EXPLAINED = 512

# Running sums per evaluated split, in this order; `split_metrics` turns them into metrics.
SUMS = ("loss", "nll", "tokens", "exact", "correct", "examples")


def split_metrics(sums: torch.Tensor) -> dict[str, torch.Tensor]:
    """One split's SUMS -> its loss, perplexity, exact match and token accuracy (float32, as logged)."""
    s = dict(zip(SUMS, sums))
    metrics = {
        "loss": s["loss"] / s["tokens"],
        # Perplexity of the unsmoothed model: exp of the mean token negative log-likelihood.
        "ppl": torch.exp(s["nll"] / s["tokens"]),
        "seq_acc": s["exact"] / s["examples"],
        "tok_acc": s["correct"] / s["tokens"],
    }
    return {name: value.float() for name, value in metrics.items()}


class Seq2SeqModule(L.LightningModule):
    def __init__(
        self,
        model: ModelConfig | dict,
        src_vocab: int,
        tgt_vocab: int,
        optim: OptimConfig | dict | None = None,
        eval_splits: tuple[str, ...] = ("test",),
        train_max_len: int = 0,
        dropout_seed: int | None = None,
    ):  # pragma: no mutate block (save_hyperparameters reads this frame; a mutmut trampoline hides it)
        """optim: OptimConfig or a config extending it (TrainConfig); None: its defaults. dropout_seed: draw
        dropout masks from a generator of this seed, as a fused model's seed does, so a seed's masks are the
        same alone or fused; None: the global generator."""
        super().__init__()
        self.model_cfg = model if isinstance(model, ModelConfig) else ModelConfig(**model)
        self.optim = OptimConfig.of(optim or {})
        self.save_hyperparameters(ignore=["model", "optim"])
        # Plain dicts, so checkpoints stay safe to load with weights_only=True.
        self.hparams["model"] = self.model_cfg.model_dump()
        self.hparams["optim"] = self.optim.model_dump()
        self.model = build_model(self.model_cfg, src_vocab, tgt_vocab, PAD_ID)
        # The training and validation steps, compiled whole or eager (train.compile; models/steps.py). The
        # model itself stays plain: parameter names, and so checkpoints, are those of the eager model.
        self.steps = Steps(self.optim.compile, self.model_cfg)
        self.eval_splits = list(eval_splits)
        self.classifies = FAMILIES[self.model_cfg.arch].classifies
        # Source tokens a decoded position stands against: a caption's, a column of an image's pixels.
        self.per_position = IMAGE_ROWS if FAMILIES[self.model_cfg.arch].images else 1
        self._sums: dict[str, torch.Tensor] = {}
        self._explained: dict[str, int] = {}  # test examples explained so far, per split
        self._dropout: list[torch.Generator] | None = None
        self._dropout_state: list[torch.Tensor] | None = None  # a resumed run's generator, to restore

    def on_train_start(self) -> None:
        # Here, not in __init__: the generator lives on the device the model trains on.
        if self.hparams.dropout_seed is not None and self._dropout is None:
            self._dropout = seed_dropout(self.model, [self.hparams.dropout_seed])
        if self._dropout is not None and self._dropout_state is not None:
            for generator, state in zip(self._dropout, self._dropout_state):
                generator.set_state(state.cpu())
            self._dropout_state = None

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._dropout is not None:
            checkpoint["dropout_generators"] = [g.get_state() for g in self._dropout]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._dropout_state = checkpoint.get("dropout_generators")

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @contextmanager
    def _inference(self):
        """Eval mode (no dropout) and no gradients, restoring the previous mode afterwards."""
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            self.train(was_training)

    def generate(self, src: torch.Tensor, beam_size: int = 1) -> torch.Tensor:
        """(B, S) -> (B, L) predicted ids, EOS kept, padded; a classifier's, its one label (B, 1)."""
        with self._inference():
            max_len = 1 if self.classifies else max_target_length(
                src, PAD_ID, self.hparams.train_max_len, self.per_position
            )  # fmt: skip
            if beam_size == 1:
                return greedy_decode(self.model, src, BOS_ID, EOS_ID, PAD_ID, max_len)
            return beam_search(
                self.model, src, BOS_ID, EOS_ID, PAD_ID, beam_size, self.optim.length_penalty, max_len
            )

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.steps.run(training_loss, self.model, batch, self.optim.label_smoothing)
        self.log("train/loss", loss, prog_bar=True)
        # Not LearningRateMonitor: it refuses to run without a logger, and the trial history keeps train/lr
        # with or without one.
        self.log("train/lr", self.lr_schedulers().get_last_lr()[0])
        return loss

    def _evaluate(self, split: str, batch: dict[str, torch.Tensor], beam_size: int, need_weights: bool):
        """Adds the batch's loss terms and generation scores to the split's sums. Returns the predictions
        (B, L) and, with need_weights, the attention weights and layer outputs of the loss's forward pass and
        a classifier's explanation (`explanation`)."""
        weights, states = {}, {}
        target = batch["tgt_out"]
        if need_weights:
            with self.model.record_states() as states:
                logits, weights = self.model(batch["src"], batch["tgt_in"], need_weights=True)
            sums = summed_losses(logits, target, self.optim.label_smoothing)
        else:
            sums = self.steps.run(loss_sums, self.model, batch, self.optim.label_smoothing)
        pred = self.generate(batch["src"], beam_size)
        scores = [score(p, t) for p, t in zip(pred.tolist(), target.tolist())]
        counts = (
            sum(s.counted for s in scores),
            sum(s.exact for s in scores),
            sum(s.correct for s in scores),
        )
        counts = torch.tensor([*counts, len(scores)], dtype=torch.float64, device=sums.device)
        sums = torch.cat([sums, counts])  # in the order of SUMS
        self._sums[split] = self._sums.get(split, 0) + sums
        record = {"pred": pred, "scores": scores, "weights": weights, "states": states}
        if need_weights and self.classifies:
            record["explanation"] = self._explain(split, batch["src"])
            weights["importance"] = [record["explanation"]["importance"][:, None, None]]  # as cross: (B, 1, 1, S)
        return record

    def _explain(self, split: str, src: torch.Tensor) -> dict[str, torch.Tensor]:
        """models/explanation.py's measures of the batch's first rows within the split's EXPLAINED examples,
        NaN for the rest (importance too, past them)."""
        rows = max(0, min(src.size(0), EXPLAINED - self._explained.get(split, 0)))
        self._explained[split] = self._explained.get(split, 0) + rows
        with self._inference():
            found = explain(self.model, src[:rows]) if rows else {}
        out = {}
        for name, values in found.items():
            rest = values.new_full((src.size(0) - rows, *values.shape[1:]), float("nan"))
            out[name] = torch.cat([values.to(src.device), rest])
        if "importance" not in out:
            out["importance"] = torch.full(src.shape, float("nan"), device=src.device)
        return out

    def _log_sums(self) -> None:
        for split, sums in self._sums.items():
            for name, value in split_metrics(sums).items():
                self.log(f"{split}/{name}", value, prog_bar=name == "loss", add_dataloader_idx=False)
        self._sums = {}

    def validate(self, batches) -> dict[str, float]:
        """val/* of a validation over `batches` outside a Trainer, as `validation_step` and `_log_sums` log
        them (a fused seed's validation, harness/fused.py)."""
        for batch in batches:
            self._evaluate("val", batch, beam_size=1, need_weights=False)
        return {f"val/{name}": float(value) for name, value in split_metrics(self._sums.pop("val")).items()}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._evaluate("val", batch, beam_size=1, need_weights=False)

    def on_validation_epoch_end(self) -> None:
        self._log_sums()

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> dict:
        """Test splits decode with beam_size; what this returns is the one evaluation pass's record of the
        batch, which harness/evaluation.py turns into every test metric beyond these sums."""
        return self._evaluate(
            self.eval_splits[dataloader_idx], batch, self.optim.beam_size, need_weights=True
        )

    def on_test_epoch_end(self) -> None:
        self._log_sums()
        self._explained = {}

    def attention(self, src: torch.Tensor, tgt_in: torch.Tensor) -> dict[str, list[torch.Tensor | None]]:
        """Teacher-forced attention weights of the model in eval mode: {'cross': [(B, H, T, S) per layer],
        ...}; which kinds there are depends on the family (empty without attention)."""
        with self._inference():
            return self.model(src, tgt_in, need_weights=True)[1]

    def configure_optimizers(self) -> dict[str, Any]:
        optimizer, scheduler = optimizer_and_schedule(self.parameters(), self.optim)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def optimizer_and_schedule(
    params, o: OptimConfig, fused: bool | None = None
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with its LambdaLR schedule, for every model alone or as fused seeds (harness/fused.py). fused:
    AdamW's single-kernel implementation (CUDA)."""
    optimizer = torch.optim.AdamW(params, lr=o.lr, weight_decay=o.weight_decay, fused=fused)
    schedule = lr_lambda(o.schedule, o.warmup_steps, o.max_steps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
