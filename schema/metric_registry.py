"""The one list of the metrics trials report, by the name after the split ("test/seq_acc" -> "seq_acc"):
each one's range, direction, judging scale, where it is computed and which trials report it. Every reader
of a metric name (harness.metrics, schema.spec, analysis.stats, analysis.claims, reports/) looks it up here.

Torch-free and importing nothing of the project, so that analysis/ reads it as it reads the study's schema."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MetricRange:
    """The values a metric can take: [low, high], either end possibly infinite."""

    low: float = -math.inf
    high: float = math.inf

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)

    def difference(self) -> MetricRange:
        """The range of a difference of two such values (or of their averages): [low - high, high - low]."""
        return MetricRange(self.low - self.high, self.high - self.low)


UNBOUNDED = MetricRange()
PROPORTION = MetricRange(0.0, 1.0)
# Which trials report a metric ("encoders": Transformers that build an encoder; "feed-forwards": Transformers
# with feed-forward sublayers; "attending": Transformers with any attention); harness.metrics'
# produced_metrics reads each against a configuration.
# "labelled tasks": tasks whose target is one label; "attention pooling": classifiers whose pooling is
# attention; "aligned classifiers": classifiers with attention weights (attention or uniform pooling) on an
# aligned task.
Trials = Literal[
    "every trial", "text tasks", "aligned tasks", "Transformers", "encoders", "feed-forwards", "attending",
    "labelled tasks", "attention pooling", "aligned classifiers",
]


@dataclass(frozen=True)
class Metric:
    name: str  # as trials record it after the split: "seq_acc" in "test/seq_acc"
    range: MetricRange = UNBOUNDED
    direction: Literal["maximize", "minimize"] = "maximize"  # which way a better model moves it
    # How a claim measures an effect on it (analysis.claims): compare - to, or log(compare / to) with the
    # margin a ratio (losses and perplexities, whose effects are factors).
    scale: Literal["difference", "ratio"] = "difference"
    exact_match: bool = False  # all or nothing per seed: a claim needs three seeds a side (analysis.claims)
    # Where it is computed, which fixes the splits it is logged on: "module", models.module.Seq2SeqModule,
    # logs it at every validation (val/...) and on every test split; "evaluation", harness.evaluation,
    # computes it from the test pass, on the test splits only; "initialisation", harness.trial, from the model
    # before its first step, on the split "init" alone. None for a name outside the registry.
    computed_by: Literal["module", "evaluation", "initialisation"] | None = None
    reported_for: Trials | None = None  # None: no trial reports it (a name outside the registry)

    @property
    def every_split(self) -> bool:
        """Logged on the validation split at every validation as well as on the test splits."""
        return self.computed_by == "module"


METRICS = {m.name: m for m in (
    Metric("loss", MetricRange(0.0), "minimize", "ratio", computed_by="module", reported_for="every trial"),
    Metric("ppl", MetricRange(1.0), "minimize", "ratio", computed_by="module", reported_for="every trial"),
    Metric("seq_acc", PROPORTION, exact_match=True, computed_by="module", reported_for="every trial"),
    Metric("tok_acc", PROPORTION, computed_by="module", reported_for="every trial"),
    Metric("bleu", MetricRange(0.0, 100.0), computed_by="evaluation", reported_for="text tasks"),
    Metric("chrf", MetricRange(0.0, 100.0), computed_by="evaluation", reported_for="text tasks"),
    # The attention's links against the gold ones, where the model cross-attends.
    Metric("aer", PROPORTION, "minimize", computed_by="evaluation", reported_for="aligned tasks"),
    # ||X - mean token|| / ||X|| of the last layer's outputs: 0 when every token is the same vector.
    Metric("rank_collapse_encoder", PROPORTION, computed_by="evaluation", reported_for="encoders"),
    Metric("rank_collapse_decoder", PROPORTION, computed_by="evaluation", reported_for="Transformers"),
    # At initialisation (models/diagnostics.py at_initialisation): the gradient in the last decoder layer's
    # feed-forward output weight, its ratio to the first layer's, and the attention's entropy relative to
    # uniform (1: uniform; 0: one key).
    Metric("grad_last", MetricRange(0.0), "minimize", "ratio", computed_by="initialisation",
           reported_for="feed-forwards"),
    Metric("grad_growth", MetricRange(0.0), "minimize", "ratio", computed_by="initialisation",
           reported_for="feed-forwards"),
    Metric("attn_entropy", PROPORTION, computed_by="initialisation", reported_for="attending"),
    # Classification: the mean of each label's F1 over the labels that are true or predicted in the split.
    Metric("macro_f1", PROPORTION, computed_by="evaluation", reported_for="labelled tasks"),
    # Whether attention explains (models/explanation.py), means over the explained test examples: Kendall's
    # tau of attention against gradient and leave-one-out importance; the output's change (TVD) when the
    # weights are permuted; how far (JSD, bits) attention moved while the output stayed put.
    Metric("tau_grad", MetricRange(-1.0, 1.0), computed_by="evaluation", reported_for="attention pooling"),
    Metric("tau_loo", MetricRange(-1.0, 1.0), computed_by="evaluation", reported_for="attention pooling"),
    Metric("perm_tvd", PROPORTION, computed_by="evaluation", reported_for="attention pooling"),
    Metric("adv_jsd", PROPORTION, computed_by="evaluation", reported_for="attention pooling"),
    # The pooling's weight on the gold rationale's tokens, mean over examples (1: all of it).
    Metric("rationale_mass", PROPORTION, computed_by="evaluation", reported_for="aligned classifiers"),
)}  # fmt: skip


def metric_info(metric: str) -> Metric:
    """The entry of a metric named `split/name` (or a bare name); a name outside the registry is unbounded,
    higher is better, judged as a difference, and reported by no trial."""
    name = metric.rsplit("/", 1)[-1]
    return METRICS.get(name) or Metric(name)


def metric_range(metric: str) -> MetricRange:
    """The range of a metric named `split/name` (or a bare name); unknown metrics are unbounded."""
    return metric_info(metric).range
