"""How the report writes a number, the same in its tables and in its sentences: three decimals by default,
a dash for a missing value, an interval's ends in brackets, a p-value below P_FLOOR as below it; and user
text in a Markdown table cell."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ablate.schema.text import shown

P_FLOOR = 0.001  # a smaller p-value is written as below it: "<0.001"


def number(x, digits: int = 3) -> str:
    """A number for a table cell or a sentence; missing, NaN or non-numeric values show as a dash."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(x)
    try:
        value = float(x)
    except (TypeError, ValueError):
        return "–"
    return f"{value:.{digits}f}" if np.isfinite(value) else "–"


def bounds(low, high) -> str:
    """A confidence interval's two ends: '[-0.910, -0.810]'."""
    return f"[{number(low)}, {number(high)}]"


def pvalue(p) -> str:
    """A p-value for a table cell: '0.012', '<0.001', or a dash without one."""
    return "–" if p is None or not np.isfinite(p) else f"<{P_FLOOR}" if p < P_FLOOR else f"{p:.3f}"


_ENTITY = re.compile(r"&(?=#?\w+;)")


def md_cell(text: Any) -> str:
    """A Markdown table cell: no pipes, newlines or raw HTML from user text. A bare `&` stays as it is so
    the raw file reads well; only one that would start an entity (`&lt;`) is escaped."""
    s = shown(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")
    return _ENTITY.sub("&amp;", s).replace("<", "&lt;").replace(">", "&gt;")
