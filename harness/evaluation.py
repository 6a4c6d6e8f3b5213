"""One evaluation pass: after training, `trainer.test` decodes each test split once, for every test metric.
Seq2SeqModule.test_step runs one teacher-forced forward (loss, perplexity, attention weights, layer outputs)
and one decode (exact match, token accuracy) per batch; the Evaluation callback adds from each batch's record
the per-length table, BLEU / chrF and translations, AER, rank collapse and the probes' attention samples."""

from __future__ import annotations

from typing import Any

import lightning as L
import numpy as np
import torch

from ablate.harness.artifacts import AttentionSample
from ablate.harness.metrics import (
    alignment_error_rate,
    length_table,
    macro_f1,
    rationale_mass,
    translation_scores,
    translations,
)  # fmt: skip
from ablate.harness.probes import Probe
from ablate.harness.tasks import Example, TaskData
from ablate.models.diagnostics import rank_collapse
from ablate.models.explanation import MEASURES
from ablate.models.sequences import PAD_ID, UNK, SequenceScore


def predicted_label(tokens: list[str]) -> str | None:
    """A classifier's decoded output as a label: its first token, or None where it emitted none or `<unk>`,
    which is no label of the task (macro-F1 would otherwise score it as a class of its own)."""
    return tokens[0] if tokens and tokens[0] != UNK else None


class SplitPass:
    """What one test split's batches leave behind, in the split's order (evaluation loaders keep it)."""

    def __init__(
        self, split: str, examples: list[Example], probes: list[Probe], classifies: bool = False,
        labelled: bool = False,
    ):  # fmt: skip
        """classifies: a classifier's pass (rationale mass, explanation measures); labelled: a task whose target
        is one label (macro-F1)."""
        self.split, self.examples, self.probes = split, examples, probes
        self.classifies, self.labelled = classifies, labelled
        self.seen = 0
        self.scores: list[SequenceScore] = []
        self.predictions: list[list[int]] = []
        self.samples: list[AttentionSample] = []
        # Last cross-attention layer per example, mean over heads (T, S): only where gold alignments exist.
        self.cross: list[torch.Tensor] | None = (
            [] if all(ex.alignment is not None for ex in examples) else None
        )
        self.collapse: dict[str, float] = {}  # rank collapse summed over sequences, per side
        self.explanation: dict[str, list[float]] = {}  # a classifier's measures per example (NaN: none)
        self.translations: list[dict[str, Any]] = []  # text tasks: per example, set by `metrics`

    def add(self, record: dict[str, Any], batch: dict[str, torch.Tensor]) -> None:
        """One batch's record from Seq2SeqModule.test_step: pred, scores, weights, states."""
        size = batch["src"].size(0)
        self.scores += record["scores"]
        self.predictions += record["pred"].tolist()
        cross = (record["weights"].get("cross") or [None])[-1]  # the last layer's, if any
        if self.cross is not None and cross is not None:
            self.cross.extend(cross.float().mean(1).cpu())  # (B, H, T, S) -> B x (T, S)
        else:
            self.cross = None  # a model without cross-attention has no AER
        masks = {"encoder": batch["src"] != PAD_ID, "decoder": batch["tgt_in"] != PAD_ID}
        for side, layers in record["states"].items():
            if layers:  # no encoder layers without cross-attention
                value = float(rank_collapse(layers[-1].float(), masks[side]).sum())
                self.collapse[side] = self.collapse.get(side, 0.0) + value
        for name in MEASURES:
            if name in record.get("explanation", {}):
                self.explanation.setdefault(name, []).extend(record["explanation"][name].tolist())
        self.samples += [
            p.sample(record["weights"], p.index - self.seen)
            for p in self.probes
            if 0 <= p.index - self.seen < size
        ]
        self.seen += size

    def metrics(self, data: TaskData) -> dict[str, float]:
        """BLEU / chrF (text tasks), AER (gold alignments, cross-attention), rank collapse (Transformers);
        macro-F1 (labelled tasks), rationale mass and the explanation measures (classifiers)."""
        rows = [(pred, None) for pred in self.predictions]
        self.translations = translations(self.split, rows, data)
        self.signatures = {}
        metrics = {}
        for name, score in translation_scores(self.split, self.translations).items():
            metrics[name] = score.value
            self.signatures[name.rsplit("/", 1)[-1]] = score.signature  # the same on every split
        if self.cross is not None:
            sizes = [(len(ex.src), len(ex.tgt)) for ex in self.examples]
            gold = [ex.alignment for ex in self.examples]
            possible = [ex.possible for ex in self.examples]
            metrics[f"{self.split}/aer"] = alignment_error_rate(self.cross, gold, sizes, possible)
            if self.classifies:
                metrics[f"{self.split}/rationale_mass"] = rationale_mass(self.cross, gold)
        if self.labelled:
            labels = [predicted_label(data.tgt_vocab.decode(pred)) for pred in self.predictions]
            metrics[f"{self.split}/macro_f1"] = macro_f1(labels, [ex.tgt[0] for ex in self.examples])
        for name, values in self.explanation.items():
            if np.isfinite(values).any():
                metrics[f"{self.split}/{name}"] = float(np.nanmean(values))
        for side, total in self.collapse.items():
            metrics[f"{self.split}/rank_collapse_{side}"] = total / self.seen
        return metrics


class Evaluation(L.Callback):
    """Collects the test pass, whose results `metrics`, `per_length` and `attention` give afterwards."""

    def __init__(
        self, data: TaskData, splits: list[str], probes: list[Probe], classifies: bool = False,
        labelled: bool = False,
    ):  # fmt: skip
        self.data, self.splits, self.probes = data, list(splits), probes
        self.classifies, self.labelled = classifies, labelled
        self.passes: dict[str, SplitPass] = {}

    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.passes = {
            split: SplitPass(split, self.data.splits[split], [p for p in self.probes if p.split == split],
                             self.classifies, self.labelled)
            for split in self.splits
        }  # fmt: skip

    def on_test_batch_end(
        self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx: int = 0
    ) -> None:
        self.passes[self.splits[dataloader_idx]].add(outputs, batch)

    def metrics(self) -> dict[str, float]:
        return {name: value for p in self.passes.values() for name, value in p.metrics(self.data).items()}

    def signatures(self) -> dict[str, str]:
        """sacreBLEU's signature of each text metric ("bleu", "chrf"), for text tasks."""
        return {name: sig for p in self.passes.values() for name, sig in p.signatures.items()}

    def translations(self) -> list[dict[str, Any]]:
        """Rows of {split, src_len, hyp, ref} per test sentence of a text task, in each split's order:
        what BLEU by sentence length and paired tests between variants are computed from."""
        return [{"split": split, **row} for split, p in self.passes.items() for row in p.translations]

    def per_length(self) -> list[dict[str, Any]]:
        """Rows of {split, length, n, seq_acc, tok_acc, tokens}: accuracy by target length (without EOS)."""
        return [
            {"split": split, "length": row["length_min"], "n": row["n"], "seq_acc": row["seq_acc"],
             "tok_acc": row["tok_acc"], "tokens": row["tokens"]}
            for split, p in self.passes.items() for row in length_table(p.scores)
        ]  # fmt: skip

    def attention(self) -> list[AttentionSample]:
        return [sample for p in self.passes.values() for sample in p.samples]
