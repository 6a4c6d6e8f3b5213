"""The names three ModelConfig switches accept, each with what the model code builds for it:

  model.arch  FAMILIES  the model family: the nn.Module class build_model (models/__init__.py) builds
  model.cell  CELLS     the recurrent cell of the LSTM family (models/rnn.py)
  model.norm  NORMS     where the Transformer's norms sit, and which (models/transformer.py)

This module imports no torch (config checks read it); the model code reads each entry when it builds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# model.arch -> module and class of its family's nn.Module, imported only to build one (torch loads slowly).
FAMILIES = {
    "lstm": ("ablate.models.rnn", "RNNSeq2Seq"),
    "transformer": ("ablate.models.transformer", "Transformer"),
}


@dataclass(frozen=True)
class Cell:
    op: str  # the torch function nn.LSTM / nn.GRU call (torch.lstm, torch.gru), which models.rnn.RNN calls
    gates: int  # gate blocks in each weight: weight_ih is (gates·H, in), as nn.LSTM's / nn.GRU's
    states: tuple[str, ...]  # the parts of its recurrent state


CELLS = {"lstm": Cell("lstm", 4, ("h", "c")), "gru": Cell("gru", 3, ("h",))}


@dataclass(frozen=True)
class Norm:
    # "pre": on each sublayer's input, and once more on each stack's output (its residual stream is never
    # normalised otherwise); "post": on each sublayer's output after the residual sum; None: no norm.
    where: Literal["pre", "post"] | None
    rms: bool = False  # RMSNorm rather than LayerNorm


NORMS = {"post": Norm("post"), "pre": Norm("pre"), "none": Norm(None), "rms_pre": Norm("pre", rms=True)}
