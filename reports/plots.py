"""Seaborn figures for a study report; each function returns a matplotlib Figure."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # reports render headless
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402


def metric_by_variant(df: pd.DataFrame, metric: str, order: list[str]) -> plt.Figure:
    """Mean with 95% CI per variant, every seed drawn as a point."""
    done = df[df["state"] == "COMPLETE"].dropna(subset=[metric])
    fig, ax = plt.subplots(figsize=(max(5, 1.3 * len(order)), 3.6))
    sns.barplot(data=done, x="variant", y=metric, order=order, errorbar=("ci", 95), ax=ax, color="#9ecae1")
    sns.stripplot(data=done, x="variant", y=metric, order=order, ax=ax, color="#08306b", size=5, jitter=0.15)
    ax.set_xlabel("")
    ax.tick_params(axis="x", rotation=20)
    fig.tight_layout()
    return fig
