"""One probe's attention drawn with labelled axes: the PNG each trial keeps beside its arrays (optuna-dashboard
shows it inline) and the panels of the report's heatmap grid. Matplotlib's Figure without pyplot: no global
backend state, and no torch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ablate.harness.artifacts import AttentionSample
from ablate.harness.metrics import alignment_error_rate
from ablate.models.sequences import EOS, IMAGE_ROWS

KINDS = {"cross": "cross-attention", "encoder": "encoder self-attention", "decoder": "decoder self-attention"}
# A classifier's text shaded token by token: its attention pooling's weights, then its gradient importance.
SHADES = {"cross": "attention", "importance": "gradient"}
LINE_CHARS = 44  # characters of tokens per line of shaded text
SHADE = colormaps["Oranges"]
LIT = 0.75  # how much of a captioner's image its most attended pixel's colour covers


def last_layer(sample: AttentionSample, kind: str) -> np.ndarray | None:
    """The last layer's weights of `kind`, heads averaged: (rows, cols), or None if the model has none."""
    weights = sample.weights.get(kind)
    return None if weights is None or weights.size == 0 else weights[-1].mean(0)


def cross_attention(sample: AttentionSample) -> np.ndarray | None:
    """The cross-attention map a probe is judged by: the last layer, heads averaged, (tgt_out, src)."""
    return last_layer(sample, "cross")


def probe_aer(sample: AttentionSample) -> float:
    """AER of the cross-attention argmax against the probe's gold alignment, EOS rows (where targets end)
    and columns left out; NaN without a gold alignment or cross attention."""
    matrix = cross_attention(sample)
    if matrix is None or not (len(sample.alignment) or len(sample.possible)):
        return np.nan
    sizes = [(len(sample.src) - 1, len(sample.tgt_out) - (sample.tgt_out[-1:] == [EOS]))]
    return alignment_error_rate([matrix], [sample.alignment.tolist()], sizes, [sample.possible.tolist()])


def labels_one(sample: AttentionSample) -> bool:
    """A classifier's probe: one predicted token, the label, whose weights over the text are a row."""
    return len(sample.tgt_out) == 1


def wrap(tokens: list[str]) -> list[list[int]]:
    """The tokens' indices line by line, at most LINE_CHARS characters (and spaces) to a line."""
    lines, used = [[]], 0
    for i, token in enumerate(tokens):
        if used and used + len(token) + 1 > LINE_CHARS:
            lines.append([])
            used = 0
        lines[-1].append(i)
        used += len(token) + 1
    return lines


def shade(ax, sample: AttentionSample, title: str) -> None:
    """The lecture's figure of a classifier's text: each token on a background as dark as its weight (over
    the text's largest), a block per measure of SHADES the probe has, the gold rationale's tokens underlined
    in red. Lines are spaced to fill the panel, so a long text stays whole."""
    ax.axis("off")
    rationale = {int(s) for s, _ in sample.alignment}
    rows = {name: last_layer(sample, kind) for kind, name in SHADES.items()}
    rows = {name: row[0] for name, row in rows.items() if row is not None and np.isfinite(row).all()}
    lines = wrap(sample.src)
    step = 1.0 / (len(rows) * (len(lines) + 2) + 1)  # a heading, the lines and a gap per block
    y = 1.0
    for name, weights in rows.items():
        largest = max(float(weights.max()), 1e-12)
        ax.text(0.0, y, f"{name} (largest {largest:.2f})", fontsize=7, style="italic", va="top")
        for line in lines:
            y -= step
            x = 0.0
            for i in line:
                token = sample.src[i]
                shade_of = float(weights[i]) / largest
                ax.text(x, y, token, fontsize=7, va="top", family="monospace",
                        bbox={"facecolor": SHADE(shade_of), "edgecolor": "none", "pad": 1.0},
                        color="white" if shade_of > 0.6 else "black")  # fmt: skip
                if i in rationale:
                    ax.plot([x, x + len(token) / LINE_CHARS], [y - 0.6 * step] * 2, color="red", lw=1.0)
                x += (len(token) + 1) / LINE_CHARS
        y -= 2 * step
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{title}: {' '.join(sample.tgt_out)}", fontsize=8)


def picture(ax, sample: AttentionSample, title: str) -> None:
    """The lecture's figure of a captioner (Xu et al. 2015's Figure 2): for each step of the caption, top to
    bottom, its image (ink dark on white) with each pixel lit by the attention it got over the step's
    largest (tinted, so the ink shows through), and the part of the image that step's gold links allow boxed
    in red."""
    weights = cross_attention(sample)  # (T, S): EOS is the source's last token
    levels = np.array([float(token) for token in sample.src[:-1]])
    columns = len(levels) // IMAGE_ROWS
    ink = 1.0 - levels.reshape(columns, IMAGE_ROWS).T / max(float(levels.max()), 1e-12)  # (rows, columns)
    bands = []
    for t in range(len(sample.tgt_out)):
        lit = weights[t, : len(levels)].reshape(columns, IMAGE_ROWS).T
        lit = (lit / max(float(lit.max()), 1e-12))[..., None]
        # The colour covers at most LIT of the ink, so the digit shows through the brightest pixel too.
        band = (1 - LIT * lit) * ink[..., None].repeat(3, -1) + LIT * lit * np.asarray(SHADE(lit[..., 0]))[..., :3]
        bands += [band, np.ones((1, columns, 3))]  # a white line between steps
    picture = np.clip(np.concatenate(bands[:-1]), 0.0, 1.0)  # float32 weights blend a hair past 1
    ax.imshow(picture, aspect="equal", interpolation="nearest")
    height = IMAGE_ROWS + 1
    links = np.concatenate([sample.alignment, sample.possible]).reshape(-1, 2)
    for t in np.unique(links[:, 1]):  # the box around each step's gold pixels
        column, row = np.divmod(links[links[:, 1] == t, 0], IMAGE_ROWS)
        ax.add_patch(Rectangle((column.min() - 0.5, t * height + row.min() - 0.5), np.ptp(column) + 1,
                               np.ptp(row) + 1, fill=False, edgecolor="red", linewidth=1.0))  # fmt: skip
    ax.set_yticks([t * height + IMAGE_ROWS / 2 - 0.5 for t in range(len(sample.tgt_out))], sample.tgt_out,
                  fontsize=7)  # fmt: skip
    ax.set_xticks([])
    ax.grid(False)
    ax.set_title(title, fontsize=8)


def draw(ax, sample: AttentionSample, kind: str, title: str) -> None:
    """One heatmap of `kind` on `ax`, tokens on both axes; cross-attention marks the gold links with red
    squares, a classifier's (one row) is its text shaded instead (`shade`), and a captioner's its image lit
    step by step (`picture`)."""
    if kind == "cross" and labels_one(sample):
        shade(ax, sample, title)
        return
    if kind == "cross" and sample.image:
        picture(ax, sample, title)
        return
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
    if labels_one(sample) and (kinds or last_layer(sample, "importance") is not None):
        kinds = ["cross"]  # a classifier: its text shaded by each measure it has, in one panel
    if not kinds:
        return None
    fig = Figure(figsize=(3.4 * len(kinds), 3.4))
    for ax, kind in zip(fig.subplots(1, len(kinds), squeeze=False)[0], kinds):
        aer = probe_aer(sample) if kind == "cross" else np.nan
        name = "pooling" if labels_one(sample) else KINDS[kind]
        title = f"{name}, {sample.split}" + (f", AER {aer:.2f}" if np.isfinite(aer) else "")
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
