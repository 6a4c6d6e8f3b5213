"""Seq2SeqModule: one LightningModule that trains and evaluates every model family."""

from __future__ import annotations

import math
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F

from models import build_model
from models.config import ModelConfig
from models.decoding import greedy_decode

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def lr_lambda(schedule: str, warmup_steps: int, max_steps: int):
    """Multiplier on the base lr at a given step (LambdaLR)."""
    warmup = max(warmup_steps, 0)

    def constant(step: int) -> float:
        return min(1.0, (step + 1) / warmup) if warmup else 1.0

    def inverse_sqrt(step: int) -> float:
        # Vaswani et al. 2017: linear warmup, then decay with 1/sqrt(step); equals 1 at the end of warmup.
        step = step + 1
        w = max(warmup, 1)
        return min(step / w, math.sqrt(w / step))

    def cosine(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, max_steps - warmup))
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return {"constant": constant, "inverse_sqrt": inverse_sqrt, "cosine": cosine}[schedule]


def sequence_scores(pred: torch.Tensor, tgt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """pred (B, L) generated ids, tgt (B, T) reference ids ending in EOS then padding.

    Returns per example: exact match (bool), correct target positions, target positions."""
    length = max(pred.size(1), tgt.size(1))
    pred = F.pad(pred, (0, length - pred.size(1)), value=PAD_ID)
    tgt = F.pad(tgt, (0, length - tgt.size(1)), value=PAD_ID)
    real = tgt != PAD_ID
    # Everything the model emitted after its EOS is already padding (greedy_decode masks it).
    same = (pred == tgt) | ~real
    exact = same.all(1) & ((pred != PAD_ID) == real).all(1)
    return exact, ((pred == tgt) & real).sum(1), real.sum(1)


class Seq2SeqModule(L.LightningModule):
    def __init__(
        self,
        model: ModelConfig | dict,
        src_vocab: int,
        tgt_vocab: int,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        schedule: str = "constant",
        warmup_steps: int = 0,
        max_steps: int = 1000,
        label_smoothing: float = 0.0,
        eval_splits: tuple[str, ...] = ("test",),
    ):
        super().__init__()
        self.model_cfg = model if isinstance(model, ModelConfig) else ModelConfig(**model)
        self.save_hyperparameters(ignore=["model"])
        self.hparams["model"] = self.model_cfg.model_dump()  # a plain dict, so checkpoints stay safe to load
        self.model = build_model(self.model_cfg, src_vocab, tgt_vocab, PAD_ID)
        self.eval_splits = list(eval_splits)
        # Per split: list of (prediction ids, target ids) rows, filled by test_step for the harness.
        self.predictions: dict[str, list[tuple[list[int], list[int]]]] = {}
        self._sums: dict[str, torch.Tensor] = {}

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.model(batch["src"], batch["tgt_in"])
        return F.cross_entropy(
            logits.flatten(0, 1), batch["tgt_out"].flatten(),
            ignore_index=PAD_ID, label_smoothing=self.hparams.label_smoothing,
        )  # fmt: skip

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def _accumulate(self, split: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        pred = greedy_decode(self.model, batch["src"], BOS_ID, EOS_ID, PAD_ID)
        exact, correct, total = sequence_scores(pred, batch["tgt_out"])
        sums = torch.stack(
            [exact.sum(), correct.sum(), total.sum(), torch.tensor(exact.numel(), device=exact.device)]
        )
        self._sums[split] = self._sums.get(split, 0) + sums
        return pred

    def _log_sums(self) -> None:
        for split, (exact, correct, total, n) in self._sums.items():
            self.log(f"{split}/seq_acc", (exact / n).item(), add_dataloader_idx=False)
            self.log(f"{split}/tok_acc", (correct / total).item(), add_dataloader_idx=False)
        self._sums = {}

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self.log("val/loss", self.loss(batch), prog_bar=True, batch_size=batch["src"].size(0))
        self._accumulate("val", batch)

    def on_validation_epoch_end(self) -> None:
        self._log_sums()

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.eval_splits[dataloader_idx]
        self.log(f"{split}/loss", self.loss(batch), add_dataloader_idx=False, batch_size=batch["src"].size(0))
        pred = self._accumulate(split, batch)
        rows = self.predictions.setdefault(split, [])
        rows.extend(zip(pred.tolist(), batch["tgt_out"].tolist()))

    def on_test_epoch_start(self) -> None:
        self.predictions = {}

    def on_test_epoch_end(self) -> None:
        self._log_sums()

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        optimizer = torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(hp.schedule, hp.warmup_steps, hp.max_steps)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
