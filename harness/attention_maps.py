"""One probe's attention drawn with labelled axes: the PNG each trial keeps beside its arrays (optuna-dashboard
shows it inline) and the panels of the report's heatmap grid. Matplotlib's Figure without pyplot: no global
backend state, and no torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from ablate.harness.artifacts import AttentionSample
from ablate.harness.metrics import alignment_error_rate

KINDS = {"cross": "cross-attention", "encoder": "encoder self-attention", "decoder": "decoder self-attention"}


def last_layer(sample: AttentionSample, kind: str) -> np.ndarray | None:
    """The last layer's weights of `kind`, heads averaged: (rows, cols), or None if the model has none."""
    weights = sample.weights.get(kind)
    return None if weights is None or weights.size == 0 else weights[-1].mean(0)


def cross_attention(sample: AttentionSample) -> np.ndarray | None:
    """The cross-attention map a probe is judged by: the last layer, heads averaged, (tgt_out, src)."""
    return last_layer(sample, "cross")


def probe_aer(sample: AttentionSample) -> float:
    """AER of the cross-attention argmax against the probe's gold alignment, EOS rows and columns
    left out; NaN without a gold alignment or cross attention."""
    matrix = cross_attention(sample)
    if matrix is None or not len(sample.alignment):
        return np.nan
    sizes = [(len(sample.src) - 1, len(sample.tgt_out) - 1)]
    return alignment_error_rate([matrix], [sample.alignment.tolist()], sizes)


def draw(ax, sample: AttentionSample, kind: str, title: str) -> None:
    """One heatmap of `kind` on `ax`, tokens on both axes; cross-attention marks the gold links with red
    squares."""
    rows, cols = sample.axes(kind)
    ax.imshow(last_layer(sample, kind), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.grid(False)
    if kind == "cross" and len(sample.alignment):
        ax.scatter(sample.alignment[:, 0], sample.alignment[:, 1], marker="s", s=60, facecolors="none",
                   edgecolors="red", linewidths=1.0)  # fmt: skip
    ax.set_title(title, fontsize=8)


def probe_figure(sample: AttentionSample) -> Figure | None:
    """A panel per kind of attention the model has (last layer, heads averaged); None without any."""
    kinds = [kind for kind in KINDS if last_layer(sample, kind) is not None]
    if not kinds:
        return None
    fig = Figure(figsize=(3.4 * len(kinds), 3.4))
    for ax, kind in zip(fig.subplots(1, len(kinds), squeeze=False)[0], kinds):
        aer = probe_aer(sample) if kind == "cross" else np.nan
        title = f"{KINDS[kind]}, {sample.split}" + (f", AER {aer:.2f}" if np.isfinite(aer) else "")
        draw(ax, sample, kind, title)
    fig.tight_layout()
    return fig


def save_probe_image(sample: AttentionSample, path: str | Path) -> bool:
    """Writes the probe's figure as a PNG; False (and no file) for a model without attention."""
    fig = probe_figure(sample)
    if fig is None:
        return False
    fig.savefig(path, format="png", dpi=100)
    return True
