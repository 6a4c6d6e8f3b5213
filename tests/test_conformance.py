"""`ablate check`'s conformance checks (harness/conformance.py) pass every built-in registry entry; the
planted bugs that fail them are in tests/test_plugins.py, as plug-ins."""

from __future__ import annotations

import pytest
import torch

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
    + [{"arch": "captioner", "attention": "additive", "doubly_stochastic": 1.0}, {"arch": "captioner"}]
    + [{"arch": "classifier", "pooling": "attention", "attention": "additive"}]
)
FORMULA_FREE = ("lstm", "captioner", "classifier")  # families whose entries here read no formula


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: ",".join(f"{k}={v}" for k, v in entry.items()))
def test_every_built_in_entry_passes_every_check(entry):
    outcomes = list(check(ModelConfig(**SMALL, **entry), torch.device("cpu")))
    assert [o.check for o in outcomes] == list(CHECKS)
    assert [(o.check, o.detail) for o in outcomes if not o.passed] == []
    # The formulas given: the dot and cosine scores, sinusoidal positions.
    compared = {"score": {"dot", "cosine"}, "pos_encoding": {"sinusoidal"}}
    given = entry.get("score", "dot") in compared["score"] or entry.get("pos_encoding", "sinusoidal") in compared["pos_encoding"]
    assert outcomes[-1].ran == (entry.get("arch") not in FORMULA_FREE and given), outcomes[-1]
    causal = next(o for o in outcomes if o.check == "causal mask")
    assert causal.ran == entry.get("causal_mask", True), causal  # not counted as passed where it cannot run


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_every_built_in_entry_passes_every_check_on_cuda():
    failed = [(entry, o.check, o.detail) for entry in ENTRIES
              for o in check(ModelConfig(**SMALL, **entry), torch.device("cuda")) if not o.passed]  # fmt: skip
    assert failed == []


@pytest.mark.parametrize(
    "entry, planted, said",
    [({"score": "dot"}, lambda score, q, k, cfg: q @ k.transpose(-2, -1), "score dot differs from its reference at ("),
     ({"score": "cosine"}, lambda score, q, k, cfg: q @ k.transpose(-2, -1), "score cosine differs from its reference at ("),
     ({"pos_encoding": "sinusoidal"}, lambda part, cfg, x, offset=0: x, "pos_encoding sinusoidal differs from its reference at (")],
)  # fmt: skip
def test_a_formula_the_module_does_not_follow_fails_the_reference_check(entry, planted, said, monkeypatch):
    """The contract checks cannot see a wrong formula (an unscaled q·k honours every mask); the reference can."""
    import dataclasses

    registry = TRANSFORMER_SCORES if "score" in entry else POSITIONAL
    name = next(iter(entry.values()))
    monkeypatch.setitem(registry, name, dataclasses.replace(registry[name], reference=planted))
    outcomes = {o.check: o for o in check(ModelConfig(**SMALL, **entry), torch.device("cpu"))}
    assert [c for c, o in outcomes.items() if not o.passed] == ["reference"]
    assert outcomes["reference"].detail.startswith(said), outcomes["reference"]


def test_ablate_check_refuses_a_bad_key_in_one_line():
    from conftest import ablate

    proc = ablate("check", "model.headz=2")
    assert (proc.returncode, proc.stderr) == (2, "error: model.headz: unknown config key\n")


@pytest.mark.parametrize(
    "args",
    [("--preset", "captioner-soft"), pytest.param(("model.arch=classifier", "model.d_model=16"), marks=pytest.mark.slow)],
)  # the second under -m slow: 10 s of a process each on 2 cores
def test_ablate_check_gives_a_family_a_task_it_reads(args):
    """The checks read the model alone: a classifier (a label's task) or a captioner (an image's) is checked
    without naming its task; one named wrong is still refused."""
    from conftest import ablate

    proc = ablate("check", *args, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert "fused: pass" in proc.stdout
    proc = ablate("check", *args, "task.name=copy", "--device", "cpu")
    assert proc.returncode == 2 and "cannot read task copy" in proc.stderr
