"""Per-variant summaries with bootstrap confidence intervals."""

from __future__ import annotations

import numpy as np
import pandas as pd


def bootstrap_ci(
    values: np.ndarray, level: float = 0.95, n_resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean; a single value gives a zero-width interval at that value."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return (np.nan, np.nan)
    if len(values) == 1:
        return (float(values[0]), float(values[0]))
    rng = np.random.default_rng(seed)
    means = rng.choice(values, size=(n_resamples, len(values)), replace=True).mean(1)
    alpha = (1 - level) / 2
    return float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def summarize(df: pd.DataFrame, metric: str, order: list[str] | None = None) -> pd.DataFrame:
    """One row per variant: n, mean, std, 95% CI of `metric` over completed trials."""
    done = df[df["state"] == "COMPLETE"]
    rows = []
    for variant in order or list(dict.fromkeys(df["variant"])):
        values = done.loc[done["variant"] == variant, metric].dropna().to_numpy(dtype=float)
        lo, hi = bootstrap_ci(values)
        rows.append({
            "variant": variant, "n": len(values),
            "mean": values.mean() if len(values) else np.nan,
            "std": values.std(ddof=1) if len(values) > 1 else np.nan,
            "ci_low": lo, "ci_high": hi,
        })  # fmt: skip
    return pd.DataFrame(rows)
