"""`ablate check`'s conformance checks (harness/conformance.py) pass every built-in registry entry; the
planted bugs that fail them are in tests/test_plugins.py, as plug-ins."""

from __future__ import annotations

import pytest

from ablate.harness.conformance import CHECKS, check
from ablate.models.config import ModelConfig
from ablate.models.kinds import CELLS, NORMS
from ablate.models.positional import POSITIONAL
from ablate.models.scores import SCORES, WINDOWS
from ablate.models.transformer_scores import TRANSFORMER_SCORES

SMALL = {"d_model": 16, "heads": 2, "layers": 2, "d_ff": 32}
ENTRIES = (
    [{"pos_encoding": kind} for kind in POSITIONAL]
    + [{"score": score} for score in TRANSFORMER_SCORES]
    + [{"norm": norm} for norm in NORMS]
    + [{"arch": "lstm", "attention": score} for score in SCORES]
    + [{"arch": "lstm", "attention": "dot", "attention_window": window} for window in WINDOWS]
    + [{"arch": "lstm", "cell": cell} for cell in CELLS]
    + [{"causal_mask": False}, {"decoder_self_attention": False}, {"cross_attention": False}]
)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: ",".join(f"{k}={v}" for k, v in entry.items()))
def test_every_built_in_entry_passes_every_check(entry):
    outcomes = list(check(ModelConfig(**SMALL, **entry)))
    assert [o.check for o in outcomes] == list(CHECKS)
    assert [(o.check, o.detail) for o in outcomes if not o.passed] == []


def test_ablate_check_refuses_a_bad_key_in_one_line():
    from conftest import ablate

    proc = ablate("check", "model.headz=2")
    assert (proc.returncode, proc.stderr) == (2, "error: model.headz: unknown config key\n")
