"""Attention on fixed probe examples (the first of each test split, so every trial of a study looks at the
same inputs), captured as AttentionSample arrays (.npz, harness.artifacts) and drawn as heatmaps. Weights are
teacher-forced on the gold target: rows are the tokens the decoder predicts, lined up with the task's gold
alignment where it has one."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from matplotlib import colormaps

from ablate.harness.artifacts import AttentionSample
from ablate.harness.tasks.base import TaskData
from ablate.harness.tasks.datamodule import EncodedSplit, collate
from ablate.models.module import Seq2SeqModule
from ablate.models.sequences import BOS, EOS
from ablate.schema.tasks import TASKS

PROBES_PER_SPLIT = {"test": 2, "test_long": 1}


@dataclass
class Probe:
    split: str
    index: int  # the example's position in its split
    batch: dict[str, torch.Tensor]  # one example: src (1, S), tgt_in (1, T), tgt_out (1, T)
    src: list[str]
    tgt_in: list[str]
    tgt_out: list[str]
    alignment: np.ndarray
    possible: np.ndarray
    image: bool  # its source is an image (schema/tasks.py Task.image)

    def sample(self, weights: dict[str, list[torch.Tensor | None]], row: int = 0) -> AttentionSample:
        """The probe's attention as float32 arrays, from a batch's weights where it is example `row`, its
        padding rows and columns cut off."""
        sample = AttentionSample(
            self.split, self.src, self.tgt_in, self.tgt_out, {}, self.alignment, self.possible, self.image
        )
        for kind, layers in weights.items():
            layers = [w for w in layers if w is not None]
            if layers:
                rows, cols = (len(axis) for axis in sample.axes(kind))
                # Each layer (B, H, rows, cols), or (B, rows, cols) for single-head attention.
                per_layer = [(w if w.dim() == 4 else w.unsqueeze(1))[row, :, :rows, :cols] for w in layers]
                sample.weights[kind] = torch.stack(per_layer).float().cpu().numpy()  # (layers, H, rows, cols)
        return sample


def select_probes(data: TaskData) -> list[Probe]:
    probes = []
    for split, count in PROBES_PER_SPLIT.items():
        examples = data.splits.get(split, [])[:count]
        encoded = EncodedSplit(examples, data)
        for i, ex in enumerate(examples):
            alignment, possible = (np.array(links or [], dtype=np.int64).reshape(-1, 2)
                                   for links in (ex.alignment, ex.possible))  # fmt: skip
            # As the datamodule's tgt_in / tgt_out: BOS + target and target + EOS, without EOS where a target
            # does not end (a window of text, a label).
            decoded = [BOS, *ex.tgt, *([EOS] if data.target_ends else [])]
            probes.append(Probe(split, i, collate([encoded[i]]), [*ex.src, EOS], decoded[:-1], decoded[1:],
                                alignment, possible, TASKS[data.name].image))  # fmt: skip
    return probes


def capture(module: Seq2SeqModule, probes: list[Probe]) -> list[AttentionSample]:
    """Runs each probe through the model alone (no padding) and keeps its attention."""
    samples = []
    for probe in probes:
        batch = {k: v.to(module.device) for k, v in probe.batch.items()}
        samples.append(probe.sample(module.attention(batch["src"], batch["tgt_in"])))
    return samples


CELL, GAP = 12, 4  # pixels per attention weight, and between the heads of a layer
VIRIDIS = (colormaps["viridis"](np.linspace(0.0, 1.0, 256))[:, :3] * 255).astype(np.uint8)  # (256, 3)
GOLD = np.array([255, 0, 0], dtype=np.uint8)


def heatmap(sample: AttentionSample, kind: str, layer: int) -> np.ndarray:
    """The heads of one layer side by side as an RGB image (H, W, 3): weight 0 dark, 1 yellow; cross
    attention marks the gold alignment, sure and possible links, with a red dot per link. Drawn with numpy
    alone, so it is cheap enough to log at every validation (the tokens go in the caption; reports draw
    labelled axes)."""
    weights = sample.weights[kind][layer]  # (heads, rows, cols)
    panels = []
    for head in weights:
        levels = np.clip(np.rint(head * 255), 0, 255).astype(np.int64)
        panel = VIRIDIS[levels].repeat(CELL, axis=0).repeat(CELL, axis=1)  # (rows*CELL, cols*CELL, 3)
        if kind == "cross":
            mid = CELL // 2
            for src, tgt in np.concatenate([sample.alignment, sample.possible]).reshape(-1, 2):
                panel[
                    tgt * CELL + mid - 1 : tgt * CELL + mid + 1, src * CELL + mid - 1 : src * CELL + mid + 1
                ] = GOLD
        panels += [panel, np.full((panel.shape[0], GAP, 3), 255, dtype=np.uint8)]
    return np.concatenate(panels[:-1], axis=1)


def log_images(loggers: list, samples: list[AttentionSample], step: int) -> None:
    """Heatmaps as W&B media: one key per probe and kind, one image per layer."""
    from lightning.pytorch.loggers import WandbLogger

    wandb_loggers = [lg for lg in loggers if isinstance(lg, WandbLogger)]
    if not wandb_loggers:
        return
    for i, sample in enumerate(samples):
        for kind, weights in sample.weights.items():
            images = [heatmap(sample, kind, layer) for layer in range(weights.shape[0])]
            rows, cols = sample.axes(kind)
            captions = [f"{sample.split} {kind} layer {layer}, heads left to right; rows: {' '.join(rows)}; "
                        f"columns: {' '.join(cols)}" for layer in range(len(images))]  # fmt: skip
            for logger in wandb_loggers:
                logger.log_image(f"attention/{kind}/probe{i}", images, step=step, caption=captions)
