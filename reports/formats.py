"""How the report writes a number, the same in its tables and in its sentences: three decimals by default,
a dash for a missing value, a p-value below P_FLOOR as below it."""

from __future__ import annotations

import numpy as np

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


def pvalue(p) -> str:
    """A p-value for a table cell: '0.012', '<0.001', or a dash without one."""
    return "–" if p is None or not np.isfinite(p) else f"<{P_FLOOR}" if p < P_FLOOR else f"{p:.3f}"
