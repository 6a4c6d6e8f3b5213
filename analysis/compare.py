"""Two runs of a study side by side (a re-run on fresh seeds, its CPU and GPU profiles, or two studies that
share claims): each claim's verdict, Δ and CI in each run, and each variant's mean of the study metric with
its CI and seeds, from each run's trial table by the report's own code (claims.evaluate_all,
stats.summarize), so a run's column reads as its report does.

Claims pair by their text (a study's second claim of one text with the other's second), variants by name;
what only one run has is kept, with None on the other side. Variants are compared on the first run's study
metric in both runs (every trial stores every metric it computed), so the two columns measure one thing."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import pandas as pd

from ablate.analysis import claims, stats

if TYPE_CHECKING:
    from ablate.schema.spec import StudySpec

Key = TypeVar("Key")
Item = TypeVar("Item")


@dataclass
class Run:
    """One run: its study as stored, where it is stored (as messages show it) and its trial table."""

    spec: StudySpec
    where: str
    trials: pd.DataFrame


@dataclass(frozen=True)
class VariantMean:
    """A variant's mean of the metric over its completed seeds, with its 95% CI (NaN below two seeds)."""

    mean: float
    ci_low: float
    ci_high: float
    seeds: int


@dataclass
class ClaimRow:
    text: str
    results: tuple[claims.ClaimResult | None, claims.ClaimResult | None]  # the first run's, the second's

    @property
    def changed(self) -> bool | None:
        """Whether the two runs' verdicts differ; None for a claim of one run only."""
        first, second = self.results
        return None if first is None or second is None else first.verdict != second.verdict


@dataclass
class VariantRow:
    variant: str
    means: tuple[VariantMean | None, VariantMean | None]


@dataclass
class Comparison:
    runs: tuple[Run, Run]
    metric: str  # the variants' metric: the first run's study metric
    claims: list[ClaimRow]
    variants: list[VariantRow]

    @property
    def labels(self) -> tuple[str, str]:
        """What the tables call each run: its study's name, numbered when both runs are of one study."""
        names = tuple(run.spec.name for run in self.runs)
        return names if names[0] != names[1] else (f"{names[0]} (1)", f"{names[1]} (2)")


def compare(first: Run, second: Run) -> Comparison:
    metric = first.spec.metric.name
    verdicts = [_numbered(claims.evaluate_all(run.spec, run.trials)) for run in (first, second)]
    means = [variant_means(run, metric) for run in (first, second)]
    return Comparison(
        (first, second), metric,
        [ClaimRow(text, pair) for (text, _), pair in _paired(*verdicts)],
        [VariantRow(variant, pair) for variant, pair in _paired(*means)],
    )  # fmt: skip


def variant_means(run: Run, metric: str) -> dict[str, VariantMean]:
    """Each variant of the run's study, in its order: the mean, CI and seeds of its report's variant table."""
    order = list(run.spec.variant_overrides())
    table = stats.summarize(run.trials, metric, order, baseline=None)
    return {
        row.variant: VariantMean(row.mean, row.ci_low, row.ci_high, int(row.n)) for row in table.itertuples()
    }


def _numbered(results: list[claims.ClaimResult]) -> dict[tuple[str, int], claims.ClaimResult]:
    """Claims by (text, how many before had that text): two claims of one text stay two."""
    seen: Counter[str] = Counter()
    out = {}
    for r in results:
        out[(r.claim.text, seen[r.claim.text])] = r
        seen[r.claim.text] += 1
    return out


def _paired(
    first: dict[Key, Item], second: dict[Key, Item]
) -> list[tuple[Key, tuple[Item | None, Item | None]]]:
    """Every key of either run, the first run's in its order and then the second's own: with each run's item
    or None."""
    keys = [*first, *(k for k in second if k not in first)]
    return [(k, (first.get(k), second.get(k))) for k in keys]
