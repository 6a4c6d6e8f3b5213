"""Seaborn figures for a study report: each a matplotlib Figure, or None with nothing to draw. Every figure
shows each seed's value as a point; bands and error bars are the tables' 95% CIs of the mean across seeds
(stats.mean_ci, inside the metric's range), absent with one seed. A bounded metric's axis spans its range."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # reports render headless
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.cm import ScalarMappable  # noqa: E402
from matplotlib.colors import Normalize  # noqa: E402

from ablate.analysis.stats import examples, mean_ci, mean_table, pareto_front  # noqa: E402
from ablate.harness.artifacts import AttentionSample  # noqa: E402
from ablate.harness.attention_maps import SHADE, cross_attention, draw, probe_aer  # noqa: E402
from ablate.harness.metrics import BLEU_BUCKET, BLEU_BUCKET_SENTENCES, length_buckets  # noqa: E402
from ablate.harness.metrics import bleu_by_length as bucket_bleu  # noqa: E402
from ablate.schema.metric_registry import MetricRange, metric_range  # noqa: E402

# Variant names are user text: never parse them as mathtext.
plt.rcParams["text.parse_math"] = False
sns.set_theme(style="whitegrid", context="paper")
RANGE_PAD = 0.04  # share of a bounded range left free above and below it
# BLEU by length: how far (in tokens) the outermost variants' points sit from their bucket's centre.
DODGE = 1.0
# An unbounded axis ends at this multiple of the largest seed's distance from its bound.
UNBOUNDED_HEADROOM = 1.5
# A bounded axis fitted to its curves ends at this multiple of the highest seed or interval's distance from
# its low end, and no lower than FIT_FLOOR of its range (1 BLEU point): a few points are not flattened.
FIT_HEADROOM, FIT_FLOOR = 1.15, 0.01


def completed(df: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The completed trials with a value of `metric`, as numbers: every seed a figure draws."""
    if metric not in df:
        return df.iloc[0:0]
    done = df[df["state"] == "COMPLETE"].copy()
    done[metric] = pd.to_numeric(done[metric], errors="coerce")
    return done.dropna(subset=[metric])


def _errorbar(df: pd.DataFrame, metric: str):
    """seaborn's errorbar: the tables' CI of the mean over seeds."""
    rng, n_examples = metric_range(metric), examples(df, metric)
    return lambda values: mean_ci(np.asarray(values), rng, n_examples)


def _show_range(ax, rng: MetricRange, seeds: np.ndarray | None = None) -> None:
    """A bounded metric's axis covers its range; one bounded below starts at its bound and, given the
    seeds' values, ends a little above the largest, so that a band of few seeds on the log scale (a loss's
    upper limit can be 100 times its mean at two seeds) is clipped rather than flattening every curve."""
    if rng.bounded:
        pad = RANGE_PAD * (rng.high - rng.low)
        ax.set_ylim(rng.low - pad, rng.high + pad)
    elif np.isfinite(rng.low):
        finite = seeds[np.isfinite(seeds)] if seeds is not None else np.array([])
        top = rng.low + UNBOUNDED_HEADROOM * (finite.max() - rng.low) if finite.size else None
        ax.set_ylim(bottom=rng.low, top=top if top and top > rng.low else None)


def _fit_range(ax, rng: MetricRange, drawn: np.ndarray) -> None:
    """A bounded metric's axis from its low end to a little above the highest value `drawn` (seeds and
    interval ends; FIT_HEADROOM), within its range."""
    top = np.nanmax([rng.low + FIT_FLOOR * (rng.high - rng.low), *drawn])
    ax.set_ylim(rng.low, min(rng.high, rng.low + FIT_HEADROOM * (top - rng.low)))


def metric_by_variant(df: pd.DataFrame, metric: str, order: list[str]) -> plt.Figure | None:
    """Mean with 95% CI per variant, every seed drawn as a point."""
    done = completed(df, metric)
    if done.empty:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(order)), 3.8))
    sns.pointplot(data=done, x="variant", y=metric, order=order, errorbar=_errorbar(df, metric), linestyle="none",
                  ax=ax, color="#08306b", capsize=0.15, markers="D")  # fmt: skip
    sns.stripplot(data=done, x="variant", y=metric, order=order, ax=ax, color="#6baed6", size=5, jitter=0.12)
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=25)
    _show_range(ax, metric_range(metric))
    fig.tight_layout()
    return fig


def metric_by_factor(df: pd.DataFrame, metric: str, factor: str, others: list[str]) -> plt.Figure | None:
    """Point plot of the metric over one factor's levels, faceted by a second factor and coloured by a
    third when the grid has them; every seed drawn as a small point."""
    done = completed(df, metric)
    if done.empty or factor not in done:
        return None
    done = done.astype({k: str for k in [factor, *others] if k in done})
    col = others[0] if others else None
    hue = others[1] if len(others) > 1 else None
    levels = list(dict.fromkeys(done[factor]))
    grid = sns.catplot(data=done, kind="point", x=factor, y=metric, col=col, hue=hue, order=levels,
                       errorbar=_errorbar(df, metric), capsize=0.1, dodge=0.2 if hue else False, height=3.4,
                       aspect=1.1, col_wrap=min(3, done[col].nunique()) if col else None)  # fmt: skip
    grid.map_dataframe(sns.stripplot, x=factor, y=metric, hue=hue, order=levels, jitter=0.08, size=3.5, alpha=0.7,
                       zorder=3, legend=False, **({} if hue else {"color": "#6baed6"}))  # fmt: skip
    grid.set_titles("{col_var} = {col_name}" if col else "")
    for ax in grid.axes.flat:
        _show_range(ax, metric_range(metric))
    return grid.figure


def _mean_curves(
    ax, rows: pd.DataFrame, x: str, y: str, hue_order: list[str], n_column: str, fit: bool = False
) -> None:
    """Per variant: the mean over seeds against x with its CI band (stats.mean_table; the fewest `n_column`
    examples at that x, 0 where unknown) and each seed as a point, on _show_range's axis (`fit`: _fit_range).
    Bands are cut at the axis; a mean of 0 (every seed at 0) is drawn as a point on the axis, above it."""
    rng, seeds = metric_range(y), rows[y].to_numpy(float)
    curves = mean_table(rows.sort_values(x), ["variant", x], y, n_column)
    if fit:
        _fit_range(ax, rng, np.concatenate([seeds, curves["ci_high"]]))
    else:
        _show_range(ax, rng, seeds)
    limits = ax.get_ylim() if np.isfinite(rng.low) else (-np.inf, np.inf)  # _show_range set no axis otherwise
    for variant, colour in zip(hue_order, sns.color_palette(n_colors=len(hue_order))):
        own, curve = rows[rows["variant"] == variant], curves[curves["variant"] == variant]
        ax.plot(curve[x], curve["mean"], marker="o", markersize=3.5, color=colour, label=variant, clip_on=False,
                zorder=4)  # fmt: skip
        ax.fill_between(curve[x], curve["ci_low"].clip(*limits), curve["ci_high"].clip(*limits), color=colour,
                        alpha=0.2, lw=0)  # fmt: skip
        ax.scatter(own[x], own[y], s=9, color=colour, alpha=0.55, lw=0, zorder=3)
    if np.isfinite(rng.low):
        ax.set_ylim(*limits)


def learning_curves(
    history: pd.DataFrame, columns: list[str], order: list[str], trials: pd.DataFrame
) -> plt.Figure | None:
    """One panel per logged scalar in `columns` against the training step, a line per variant; the
    example counts behind each scalar come from the trial table."""
    columns = [c for c in columns if c in history and history[c].notna().any()]
    if history.empty or not columns:
        return None
    fig, axes = plt.subplots(1, len(columns), figsize=(5.2 * len(columns), 3.8), squeeze=False)
    hue_order = [v for v in order if v in set(history["variant"])]
    for ax, column in zip(axes[0], columns):
        rows = history.dropna(subset=[column]).assign(examples=examples(trials, column) or 0)
        _mean_curves(ax, rows, "step", column, hue_order, "examples")
        ax.set_title(column)
        ax.set_xlabel("step")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    return fig


def length_accuracy(per_length: pd.DataFrame) -> pd.DataFrame | None:
    """Exact match per trial and target length, the test splits merged (weighted by examples): columns
    trial, variant, seed, length, hits, n, seq_acc; None without per-length results."""
    if per_length.empty or "seq_acc" not in per_length:
        return None
    rows = per_length.dropna(subset=["seq_acc"]).assign(hits=lambda d: d["seq_acc"] * d["n"])
    merged = rows.groupby(["trial", "variant", "seed", "length"], as_index=False)[["hits", "n"]].sum()
    return merged.assign(seq_acc=merged["hits"] / merged["n"])


def accuracy_by_length(
    per_length: pd.DataFrame, order: list[str], train_max_len: int | None
) -> plt.Figure | None:
    """Exact-match accuracy against target length per variant (length_accuracy), with the lengths beyond
    training shaded: the shape of Bahdanau et al. (2015) Fig. 2."""
    merged = length_accuracy(per_length)
    if merged is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    _mean_curves(ax, merged, "length", "seq_acc", [v for v in order if v in set(merged["variant"])], "n")
    if train_max_len is not None and merged["length"].max() > train_max_len:
        ax.axvspan(train_max_len + 0.5, merged["length"].max() + 0.5, color="#999999", alpha=0.15, lw=0)
        ax.text(train_max_len + 0.6, 1.02, "beyond training", fontsize=8, color="#555555")
    ax.legend(fontsize=8)
    ax.set_xlabel("target length (tokens)")
    ax.set_ylabel("exact match")
    fig.tight_layout()
    return fig


def length_bleu(translations: pd.DataFrame) -> pd.DataFrame | None:
    """Corpus BLEU per trial and source-length bucket, test splits pooled (harness.metrics.bleu_by_length):
    columns trial, variant, seed, length_min, length_max, length (the bucket's centre), n, bleu; None without
    translations. All trials share the buckets: BLEU_BUCKET lengths wide, with at least BLEU_BUCKET_SENTENCES
    sentences a trial on average."""
    if translations.empty:
        return None
    groups = translations.groupby(["trial", "variant", "seed"], sort=False)
    least = BLEU_BUCKET_SENTENCES * len(groups)
    buckets = length_buckets(translations["src_len"].tolist(), BLEU_BUCKET, least)
    rows = [
        {"trial": trial, "variant": variant, "seed": seed, **row}
        for (trial, variant, seed), own in groups
        for row in bucket_bleu(list(own["hyp"]), list(own["ref"]), list(own["src_len"]), buckets)
    ]
    table = pd.DataFrame(rows)
    return table.assign(length=(table["length_min"] + table["length_max"]) / 2)


def bleu_by_length(
    translations: pd.DataFrame, order: list[str], max_tokens: int | None
) -> plt.Figure | None:
    """Corpus BLEU against source length per variant (length_bleu; Bahdanau et al. 2015, Fig. 2), sources
    longer than any training pair (task.max_tokens) shaded. The axis ends a little above the highest interval,
    not at 100: models trained for minutes score a few points. Variants' points are dodged (within DODGE
    tokens of the bucket's centre) so no seed hides behind another variant's."""
    table = length_bleu(translations)
    if table is None:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    hue_order = [v for v in order if v in set(table["variant"])]
    spread = np.linspace(-DODGE, DODGE, len(hue_order)) if len(hue_order) > 1 else [0.0]
    offsets = dict(zip(hue_order, spread))
    dodged = table.assign(length=table["length"] + table["variant"].map(offsets))
    _mean_curves(ax, dodged, "length", "bleu", hue_order, "n", fit=True)
    buckets = table.drop_duplicates("length").sort_values("length")
    labels = [f"{low}-{high}" for low, high in zip(buckets["length_min"], buckets["length_max"])]
    ax.set_xticks(buckets["length"], labels)
    if max_tokens is not None and buckets["length_max"].max() > max_tokens:
        ax.axvspan(max_tokens + 0.5, buckets["length_max"].max() + 0.5, color="#999999", alpha=0.15, lw=0)
        ax.text(max_tokens + 1, ax.get_ylim()[1] * 0.95, "longer than training", fontsize=8, color="#555555")
    ax.legend(fontsize=8)
    ax.set_xlabel("source sentence length (tokens)")
    ax.set_ylabel("BLEU")
    fig.tight_layout()
    return fig


def attention_maps(samples: dict[str, list[AttentionSample]]) -> plt.Figure | None:
    """A grid of probe heatmaps: a row per variant, a column per probe, one colour bar for all; gold links
    drawn as red squares and each panel titled with its AER."""
    samples = {v: [s for s in ss if cross_attention(s) is not None] for v, ss in samples.items()}
    samples = {v: ss for v, ss in samples.items() if ss}
    if not samples:
        return None
    n_cols = max(len(ss) for ss in samples.values())
    fig, axes = plt.subplots(len(samples), n_cols, figsize=(3.4 * n_cols + 0.8, 3.3 * len(samples)), squeeze=False,
                             layout="constrained")  # fmt: skip
    for row, (variant, ss) in zip(axes, samples.items()):
        for ax, sample in zip(row, ss):
            aer = probe_aer(sample)
            title = f"{variant}\n{sample.split}" + (f", AER {aer:.2f}" if np.isfinite(aer) else "")
            draw(ax, sample, "cross", title)
        for ax in row[len(ss) :]:
            ax.axis("off")
    # Every heatmap shares draw's 0-1 colour scale: one bar reads them all. A classifier's panels are its
    # text shaded by each weight over the text's largest, a captioner's its image lit by each step's weights
    # over the step's largest (an RGB picture), both on SHADE's scale.
    images = [image for ax in axes.flat for image in ax.images if image.get_array().ndim == 2]
    scale = images[0] if images else ScalarMappable(Normalize(0.0, 1.0), SHADE)
    label = "attention weight" if images else "weight over the largest of its text or caption step"
    fig.colorbar(scale, ax=axes, shrink=min(1.0, 0.9 / len(samples) + 0.3), label=label)
    if images:
        fig.supxlabel("source", fontsize=9)
        fig.supylabel("target (predicted token)", fontsize=9)
    return fig


def quality_vs_cost(
    summary: pd.DataFrame, df: pd.DataFrame, metric: str, maximize: bool
) -> plt.Figure | None:
    """Variant means with 95% CIs against parameters and training time, every trial drawn as a faint point;
    the Pareto front joined."""
    costs = [c for c in ("params", "wall_time") if c in summary and summary[c].notna().any()]
    points = summary.dropna(subset=["mean"])
    if points.empty or not costs:
        return None
    fig, axes = plt.subplots(1, len(costs), figsize=(5.4 * len(costs), 4), squeeze=False)
    for ax, cost in zip(axes[0], costs):
        p = points.dropna(subset=[cost]).sort_values(cost)
        err = np.abs(np.vstack([p["mean"] - p["ci_low"], p["ci_high"] - p["mean"]]))
        ax.errorbar(p[cost], p["mean"], yerr=np.nan_to_num(err), fmt="o", color="#08306b", capsize=3)
        seeds = completed(df, metric)
        ax.scatter(
            pd.to_numeric(seeds[cost], errors="coerce"), seeds[metric], s=8, color="#6baed6", alpha=0.6
        )
        for _, r in p.iterrows():
            ax.annotate(
                str(r["variant"]), (r[cost], r["mean"]), fontsize=7, xytext=(4, 4), textcoords="offset points"
            )
        front = p[pareto_front(p[cost].to_numpy(), p["mean"].to_numpy(), maximize)]
        ax.step(front[cost], front["mean"], where="post", color="#e6550d", lw=1.2, label="Pareto front")
        ax.set_xlabel({"params": "parameters", "wall_time": "training time per trial (s)"}[cost])
        ax.set_ylabel(metric)
        _show_range(ax, metric_range(metric))
        if p[cost].min() > 0 and p[cost].max() / p[cost].min() > 20:
            ax.set_xscale("log")
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def param_importances(importances: pd.DataFrame) -> plt.Figure | None:
    """Bars of each tuned parameter's importance (normalized to sum to 1), per variant."""
    if importances.empty:
        return None
    n_variants = importances["variant"].nunique()
    fig, ax = plt.subplots(figsize=(6.5, 1.0 + 0.35 * len(importances) + 0.2 * n_variants))
    sns.barplot(data=importances, y="param", x="importance", hue="variant", ax=ax, orient="h")
    ax.set_xlim(0, 1)
    ax.set_ylabel("")
    fig.tight_layout()
    return fig
