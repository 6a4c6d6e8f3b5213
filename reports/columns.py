"""The variant table's columns, the one list both report templates read: each one's header, its cell for a
row of analysis.stats.summarize, and whether the table shows it. Adding a statistic: its value in
summarize's row and its Column here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ablate.reports.formats import bounds, number, pvalue

Row = dict[str, Any]  # one row of stats.summarize, as the templates receive it


@dataclass(frozen=True)
class Cell:
    text: str
    emphasis: bool = False  # set apart from the column's values (the baseline's place in the Δ column)
    note: str = ""  # a muted remark after the text


@dataclass(frozen=True)
class Column:
    header: str
    cell: Callable[[Row, str | None], Cell]  # (row, the baseline variant) -> its cell
    numeric: bool = True  # right-aligned
    # Whether the table shows the column, from the whole summary: a statistic that cannot mean anything at
    # these seeds is left out, and reports/headline.table_notes says why.
    shown: Callable[[pd.DataFrame], bool] = lambda summary: True


def show_permutation(summary: pd.DataFrame) -> bool:
    """Whether any row's permutation test could reach 0.05 at its seeds."""
    return bool((summary["p_perm_floor"] <= 0.05).any())


def show_g(summary: pd.DataFrame) -> bool:
    return bool(np.isfinite(summary["g"].astype(float)).any())


def _plain(key: str, digits: int = 3) -> Callable[[Row, str | None], Cell]:
    return lambda r, baseline: Cell(number(r[key], digits))


def _interval(low: str, high: str) -> Callable[[Row, str | None], Cell]:
    return lambda r, baseline: Cell(bounds(r[low], r[high]))


def _diff(r: Row, baseline: str | None) -> Cell:
    return Cell("baseline", emphasis=True) if r["variant"] == baseline else Cell(number(r["diff"]))


def _diff_ci(r: Row, baseline: str | None) -> Cell:
    return _interval("diff_ci_low", "diff_ci_high")(r, baseline) if r["diff"] == r["diff"] else Cell("–")


def _p_perm(r: Row, baseline: str | None) -> Cell:
    floor = r["p_perm_floor"]
    return Cell(pvalue(r["p_perm"]), note=f"(floor {number(floor)})" if floor > 0.05 else "")


VARIANT_COLUMNS = [
    Column("variant", lambda r, baseline: Cell(str(r["variant"])), numeric=False),
    Column("n", lambda r, baseline: Cell(str(r["n"]))),
    Column("rank", _plain("rank")),
    Column("mean", _plain("mean")),
    Column("± std", _plain("std")),
    Column("95% CI", _interval("ci_low", "ci_high"), numeric=False),
    Column("Δ vs baseline", _diff),
    Column("95% CI of Δ", _diff_ci, numeric=False),
    Column("p", lambda r, baseline: Cell(pvalue(r["p"]))),
    Column("p (Holm)", lambda r, baseline: Cell(pvalue(r["p_holm"]))),
    Column("p (perm.)", _p_perm, shown=show_permutation),
    Column("Hedges' g", _plain("g", 2), shown=show_g),
    Column("params", _plain("params", 0)),
    Column("time / trial (s)", _plain("wall_time", 1)),
    Column("probe AER", _plain("aer", 2)),
]


# The dashboard note's shorter table (reports/templates/note.md.j2).
NOTE_HEADERS = ("variant", "n", "mean", "95% CI", "Δ vs baseline", "95% CI of Δ", "p (Holm)")


def variant_table(
    summary: pd.DataFrame, baseline: str | None, headers: tuple[str, ...] | None = None
) -> tuple[list[Column], list[list[Cell]]]:
    """The columns the table shows (those of `headers`, where given) and each row's cells, rows in rank
    order (unranked last)."""
    columns = [c for c in VARIANT_COLUMNS if c.shown(summary) and (headers is None or c.header in headers)]
    rows = summary.sort_values("rank", na_position="last").to_dict("records")
    return columns, [[c.cell(r, baseline) for c in columns] for r in rows]
