"""The recurrent family's scores and windows by name: the names `model.attention` (besides `none`) and
`model.attention_window` accept, each built from its class in models/attention.py.

Adding one: its class and an entry in SCORES or WINDOWS. No torch here (config checks read it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ScoreKind:
    # (models.attention, d_model, heads, max_positions) -> the score module
    build: Callable[[ModuleType, int, int, int], nn.Module]
    bounded: bool = False  # scores at most model.max_positions source positions

    def max_length(self, max_positions: int) -> int | None:
        """The longest source it can score; None when any length works."""
        return max_positions if self.bounded else None


SCORES: dict[str, ScoreKind] = {
    "additive": ScoreKind(lambda a, d, h, n: a.AdditiveScore(d, h)),  # Bahdanau et al. 2015
    "dot": ScoreKind(lambda a, d, h, n: a.DotScore(h)),  # Luong et al. 2015, like general and concat
    "general": ScoreKind(lambda a, d, h, n: a.GeneralScore(d, h)),
    "concat": ScoreKind(lambda a, d, h, n: a.ConcatScore(d, h)),
    "location": ScoreKind(lambda a, d, h, n: a.LocationScore(d, h, n), bounded=True),
    "cosine": ScoreKind(lambda a, d, h, n: a.CosineScore(d, h)),  # Graves et al. 2014
    "scaled_dot": ScoreKind(lambda a, d, h, n: a.DotScore(h, scale=(d // h) ** -0.5)),  # Vaswani et al. 2017
    "uniform": ScoreKind(lambda a, d, h, n: a.UniformScore(h)),  # the mean: attention that cannot choose
}


def make_score(kind: str, d_model: int, heads: int, max_positions: int) -> nn.Module:
    """The score module named by `model.attention`."""
    from ablate.models import attention  # torch: kept out of config checks

    return SCORES[kind].build(attention, d_model, heads, max_positions)


@dataclass(frozen=True)
class WindowKind:
    # (models.attention, d_model, heads, width) -> the window module; width is model.attention_width
    build: Callable[[ModuleType, int, int, int], nn.Module]
    reads_width: bool = True  # the config refuses model.attention_width where this is False


WINDOWS: dict[str, WindowKind] = {
    "global": WindowKind(lambda a, d, h, w: a.GlobalWindow(), reads_width=False),  # every source position
    # Luong et al. 2015, Sec. 3.2: local-m centres the window on the step, local-p predicts its centre.
    "local-m": WindowKind(lambda a, d, h, w: a.MonotonicWindow(w)),
    "local-p": WindowKind(lambda a, d, h, w: a.PredictiveWindow(d, h, w)),
}


def make_window(kind: str, d_model: int, heads: int, width: int) -> nn.Module:
    """The window module named by `model.attention_window`."""
    from ablate.models import attention  # torch: kept out of config checks

    return WINDOWS[kind].build(attention, d_model, heads, width)
