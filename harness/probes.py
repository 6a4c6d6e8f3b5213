"""Attention on fixed probe examples: captured as arrays, saved as .npz, drawn as heatmaps.

The probes are the first examples of the test splits, so every trial of a study looks at the same
inputs. Weights are teacher-forced on the gold target: rows are the tokens the decoder predicts, and
they line up with the task's gold alignment where it has one."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from harness.tasks.base import BOS, EOS, TaskData
from harness.tasks.datamodule import EncodedSplit, collate
from models.module import Seq2SeqModule

PROBES_PER_SPLIT = {"test": 2, "test_long": 1}


@dataclass
class AttentionSample:
    """One probe example's attention. weights[kind] is (layers, heads, rows, cols) for kind in
    encoder (src x src), decoder (tgt_out x tgt_in) and cross (tgt_out x src)."""

    split: str
    src: list[str]  # source tokens, EOS included
    tgt_in: list[str]  # decoder inputs: BOS + target
    tgt_out: list[str]  # what each decoder step predicts: target + EOS
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    alignment: np.ndarray = field(
        default_factory=lambda: np.zeros((0, 2), dtype=np.int64)
    )  # (src, tgt) pairs

    def axes(self, kind: str) -> tuple[list[str], list[str]]:
        """Row and column labels of a weight matrix of `kind`."""
        return {"encoder": (self.src, self.src), "decoder": (self.tgt_out, self.tgt_in),
                "cross": (self.tgt_out, self.src)}[kind]  # fmt: skip

    def save(self, path: str | Path) -> None:
        arrays = {f"weights_{kind}": w for kind, w in self.weights.items()}
        np.savez_compressed(
            path, split=np.array(self.split), src=np.array(self.src), tgt_in=np.array(self.tgt_in),
            tgt_out=np.array(self.tgt_out), alignment=self.alignment, **arrays,
        )  # fmt: skip

    @classmethod
    def load(cls, path: str | Path) -> AttentionSample:
        with np.load(path, allow_pickle=False) as f:
            weights = {key.removeprefix("weights_"): f[key] for key in f.files if key.startswith("weights_")}
            return cls(str(f["split"]), f["src"].tolist(), f["tgt_in"].tolist(), f["tgt_out"].tolist(),
                       weights, f["alignment"])  # fmt: skip


@dataclass
class Probe:
    split: str
    batch: dict[str, torch.Tensor]  # one example: src (1, S), tgt_in (1, T), tgt_out (1, T)
    src: list[str]
    tgt_in: list[str]
    tgt_out: list[str]
    alignment: np.ndarray


def select_probes(data: TaskData) -> list[Probe]:
    probes = []
    for split, count in PROBES_PER_SPLIT.items():
        examples = data.splits.get(split, [])[:count]
        encoded = EncodedSplit(examples, data)
        for i, ex in enumerate(examples):
            alignment = np.array(ex.alignment or [], dtype=np.int64).reshape(-1, 2)
            probes.append(Probe(split, collate([encoded[i]]), [*ex.src, EOS], [BOS, *ex.tgt], [*ex.tgt, EOS],
                                alignment))  # fmt: skip
    return probes


def capture(module: Seq2SeqModule, probes: list[Probe]) -> list[AttentionSample]:
    """Runs each probe through the model alone (no padding) and keeps its attention as float32 arrays."""
    samples = []
    for probe in probes:
        batch = {k: v.to(module.device) for k, v in probe.batch.items()}
        weights = module.attention(batch["src"], batch["tgt_in"])
        arrays = {}
        for kind, layers in weights.items():
            layers = [w for w in layers if w is not None]
            if layers:
                # Each layer (1, H, rows, cols), or (1, rows, cols) for single-head attention.
                per_layer = [(w if w.dim() == 4 else w.unsqueeze(1))[0].float().cpu() for w in layers]
                arrays[kind] = torch.stack(per_layer).numpy()  # (layers, H, rows, cols)
        samples.append(AttentionSample(probe.split, probe.src, probe.tgt_in, probe.tgt_out, arrays,
                                       probe.alignment))  # fmt: skip
    return samples


def heatmap(sample: AttentionSample, kind: str, layer: int) -> np.ndarray:
    """All heads of one layer side by side, as an RGB image array (H, W, 3)."""
    weights = sample.weights[kind][layer]  # (heads, rows, cols)
    rows, cols = sample.axes(kind)
    heads = weights.shape[0]
    cell = 0.28
    fig = Figure(figsize=(heads * (1.2 + cell * len(cols)), 1.0 + cell * len(rows)), dpi=80)
    FigureCanvasAgg(fig)
    for h, ax in enumerate(np.atleast_1d(fig.subplots(1, heads, squeeze=False)[0])):
        ax.imshow(weights[h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
        ax.set_yticks(range(len(rows)), rows, fontsize=7)
        ax.set_title(f"{kind} layer {layer} head {h}", fontsize=8)
        if kind == "cross" and len(sample.alignment):
            ax.scatter(sample.alignment[:, 0], sample.alignment[:, 1], marker="s", s=12, facecolors="none",
                       edgecolors="red", linewidths=0.6)  # fmt: skip
    fig.tight_layout()
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def log_images(loggers: list, samples: list[AttentionSample], step: int) -> None:
    """Heatmaps as W&B media: one key per probe and kind, one image per layer."""
    from lightning.pytorch.loggers import WandbLogger

    wandb_loggers = [lg for lg in loggers if isinstance(lg, WandbLogger)]
    if not wandb_loggers:
        return
    for i, sample in enumerate(samples):
        for kind, weights in sample.weights.items():
            images = [heatmap(sample, kind, layer) for layer in range(weights.shape[0])]
            captions = [
                f"{sample.split}: {' '.join(sample.src)} -> layer {layer}" for layer in range(len(images))
            ]
            for logger in wandb_loggers:
                logger.log_image(f"attention/{kind}/probe{i}", images, step=step, caption=captions)
