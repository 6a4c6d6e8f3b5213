"""Scores of decoded outputs: exact match and token accuracy by target length (`length_table`), BLEU / chrF
(sacreBLEU, with signatures) and BLEU by source length for text tasks, attention's alignment error rate
against gold alignments; and which metrics a configuration's trials report (`produced_metrics`). Rows keep
EOS and padding. Exact match and token accuracy are models.sequences' `score`, as the module's metrics:
token accuracy counts the reference's positions through its EOS, exact match compares through EOS."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sacrebleu

from ablate.harness.tasks.base import TaskData
from ablate.models.kinds import FAMILIES
from ablate.models.sequences import SequenceScore, summarise
from ablate.schema.config import ExperimentConfig
from ablate.schema.metric_registry import METRICS
from ablate.schema.tasks import TASKS

Row = tuple[Sequence[int], Sequence[int]]  # (prediction ids, target ids)
Alignment = Iterable[tuple[int, int]]  # (source index, target index) pairs


def length_table(scores: Iterable[SequenceScore], bucket_width: int = 1) -> list[dict[str, Any]]:
    """Rows of {length_min, length_max, n, seq_acc, tok_acc, tokens} per bucket of target lengths (tokens,
    without EOS), shortest first; only buckets that hold examples appear. `tokens` is the number of target
    positions tok_acc counts, so the rows weighted by n and by tokens give the totals back."""
    buckets: dict[int, list[SequenceScore]] = defaultdict(list)
    for s in scores:
        buckets[s.length // bucket_width].append(s)
    return [
        {"length_min": b * bucket_width, "length_max": (b + 1) * bucket_width - 1, **summarise(group)}
        for b, group in sorted(buckets.items())
    ]


# BLEU as WMT reports it: sacreBLEU's own 13a tokenization of detokenized text, so a score is comparable
# with published sacreBLEU scores; chrF needs none (character 6-grams, beta 2, spaces ignored).
BLEU_TOKENIZE = "13a"


@dataclass(frozen=True)
class TextScore:
    value: float  # 0-100
    signature: str  # sacreBLEU's, e.g. nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0


def _corpus_score(
    metric: sacrebleu.metrics.base.Metric, hypotheses: list[str], references: list[str]
) -> TextScore:
    value = metric.corpus_score(hypotheses, [references]).score
    return TextScore(value, str(metric.get_signature()))  # known once scored: it counts the references


def bleu_metric() -> sacrebleu.BLEU:
    """The BLEU every score here uses (sacreBLEU's defaults, BLEU_TOKENIZE), for tests on its statistics."""
    return sacrebleu.BLEU(tokenize=BLEU_TOKENIZE)


def bleu(hypotheses: list[str], references: list[str]) -> TextScore:
    """Corpus BLEU of detokenized hypotheses against one detokenized reference each."""
    return _corpus_score(bleu_metric(), hypotheses, references)


def chrf(hypotheses: list[str], references: list[str]) -> TextScore:
    """Corpus chrF of detokenized hypotheses against one detokenized reference each."""
    return _corpus_score(sacrebleu.CHRF(), hypotheses, references)


# BLEU by sentence length: source lengths (tokens) a bucket, and the fewest sentences a bucket keeps (corpus
# BLEU of two sentences says next to nothing); a sparser bucket joins its neighbour.
BLEU_BUCKET = 10
BLEU_BUCKET_SENTENCES = 20


def length_buckets(
    lengths: Sequence[int], width: int = BLEU_BUCKET, min_sentences: int = 1
) -> list[tuple[int, int]]:
    """(first, last) length of each bucket, shortest first: `width` lengths a bucket, empty ones left out;
    then, while a bucket holds fewer than `min_sentences`, the sparsest joins its sparser neighbour (an end
    bucket its only one), so sparse tails pool into wider buckets."""
    counts: dict[int, int] = defaultdict(int)
    for length in lengths:
        counts[length // width] += 1
    buckets = [[b * width, (b + 1) * width - 1, n] for b, n in sorted(counts.items())]
    while len(buckets) > 1 and min(n for *_, n in buckets) < min_sentences:
        i = min(range(len(buckets)), key=lambda k: buckets[k][2])
        neighbours = [k for k in (i - 1, i + 1) if 0 <= k < len(buckets)]
        j = min(neighbours, key=lambda k: buckets[k][2])
        lo, hi = sorted((i, j))
        buckets[lo : hi + 1] = [[buckets[lo][0], buckets[hi][1], buckets[lo][2] + buckets[hi][2]]]
    return [(first, last) for first, last, _ in buckets]


def bleu_by_length(
    hypotheses: list[str], references: list[str], lengths: Sequence[int], buckets: Sequence[tuple[int, int]]
) -> list[dict[str, Any]]:
    """Rows of {length_min, length_max, n, bleu} per bucket (first, last) of `lengths` (the source's, as
    Bahdanau et al. 2015 Fig. 2 plots BLEU) holding sentences: their corpus BLEU, scored as `bleu` does."""
    rows = []
    for first, last in buckets:
        members = [i for i, length in enumerate(lengths) if first <= length <= last]
        if members:
            score = bleu([hypotheses[i] for i in members], [references[i] for i in members]).value
            rows.append({"length_min": first, "length_max": last, "n": len(members), "bleu": score})
    return rows


def translations(split: str, rows: Sequence[Row], data: TaskData) -> list[dict[str, Any]]:
    """Per example of a text task's data.splits[split] ([] otherwise): {src_len (source tokens), hyp, ref},
    detokenized as BLEU / chrF score them. Rows come in the split's order, as evaluation loaders give them;
    references come from the examples, so out-of-vocabulary target words are scored as written, not <unk>."""
    examples = data.splits[split]
    if not data.is_text or not rows:
        return []
    if len(rows) != len(examples):
        raise ValueError(f"{split}: {len(rows)} prediction rows for {len(examples)} examples")
    return [
        {"src_len": len(ex.src), "hyp": data.target_text(data.tgt_vocab.decode(pred)),
         "ref": data.target_text(ex.tgt)}
        for (pred, _), ex in zip(rows, examples)
    ]  # fmt: skip


def translation_scores(split: str, pairs: list[dict[str, Any]]) -> dict[str, TextScore]:
    """{split}/bleu and {split}/chrf of `translations` rows ({} for none)."""
    if not pairs:
        return {}
    hypotheses, references = [t["hyp"] for t in pairs], [t["ref"] for t in pairs]
    return {f"{split}/bleu": bleu(hypotheses, references), f"{split}/chrf": chrf(hypotheses, references)}


def attention_alignment(weights: Any, src_len: int | None = None, tgt_len: int | None = None) -> set:
    """Hard alignment read off attention weights (T, S): each target position t links to its most
    attended source position. With lengths, rows past tgt_len are ignored and a row whose maximum
    lies past src_len (on EOS or padding) links nowhere."""
    w = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=np.float64)
    src_len = w.shape[1] if src_len is None else src_len
    tgt_len = w.shape[0] if tgt_len is None else tgt_len
    return {(int(s), t) for t, s in enumerate(w[:tgt_len].argmax(-1)) if s < src_len}


def alignment_error_rate(
    attentions: Sequence[Any], gold: Sequence[Alignment], sizes: Sequence[tuple[int, int]] | None = None,
    possible: Sequence[Alignment] | None = None,
) -> float:
    """Corpus AER (Och & Ney 2003) of attention argmax alignments A against the sure gold links S and the
    possible ones P (S and, per example, `possible`): 1 - (|A & S| + |A & P|) / (|A| + |S|); 0 is perfect,
    attention that ignores the gold gives 1. With no possible links beyond the sure ones it is
    1 - 2 |A & S| / (|A| + |S|); with none sure, the share of A outside P, a row with possible links that
    links nowhere (its peak on EOS or padding) counted in A and outside P. attentions: per example a (T, S)
    array or tensor (rows target, columns source positions); gold, possible: per example (source index,
    target index) pairs, as Example.alignment and Example.possible; sizes: optional (source length, target
    length) each (attention_alignment)."""
    possible = possible if possible is not None else [()] * len(gold)
    if not len(attentions) == len(gold) == len(possible):
        raise ValueError(f"{len(attentions)} attention matrices for {len(gold)} gold alignments")
    hits = predicted = sure = 0
    for i, (weights, links, maybe) in enumerate(zip(attentions, gold, possible)):
        src_len, tgt_len = sizes[i] if sizes is not None else (None, None)
        links = {(int(s), int(t)) for s, t in links}
        allowed = links | {(int(s), int(t)) for s, t in maybe}
        shape = np.shape(weights)
        if any(s >= shape[1] or t >= shape[0] for s, t in allowed):
            raise ValueError(
                f"example {i}: gold links outside its attention matrix of shape {tuple(shape)} (T, S)"
            )
        hard = attention_alignment(weights, src_len, tgt_len)
        hits += len(hard & links) + len(hard & allowed)
        predicted += len(hard)
        if not links:  # none sure: a row with gold that links nowhere (EOS, padding) is a wrong link
            predicted += len({t for _, t in allowed} - {t for _, t in hard})
        sure += len(links)
    return 1 - hits / (predicted + sure) if predicted + sure else math.nan


def macro_f1(predicted: Sequence[str | None], true: Sequence[str]) -> float:
    """The mean of each label's F1 over the labels that are true or predicted (scikit-learn's f1_score with
    average="macro"); a prediction that is no label (None) is wrong for its true label and true of none."""
    labels = sorted(set(true) | {p for p in predicted if p is not None})
    scores = []
    for label in labels:
        hits = sum(p == t == label for p, t in zip(predicted, true))
        claimed, actual = sum(p == label for p in predicted), sum(t == label for t in true)
        scores.append(2 * hits / (claimed + actual) if claimed + actual else 0.0)
    return float(np.mean(scores)) if scores else math.nan


def rationale_mass(attentions: Sequence[Any], gold: Sequence[Alignment]) -> float:
    """The mean over examples of the weight the first row (the label's query) puts on the gold source
    positions; attentions: per example (T, S), as alignment_error_rate's."""
    masses = [float(np.asarray(w)[0, sorted({int(s) for s, _ in links})].sum()) for w, links in zip(attentions, gold)]
    return float(np.mean(masses)) if masses else math.nan


def produced_metrics(cfg: ExperimentConfig) -> set[str]:
    """The `split/name` metrics a trial of `cfg` reports (run_trial): each of the registry's
    (schema.metric_registry) whose `reported_for` holds for `cfg`, on the test splits the task fills
    (TaskConfig.test_splits), on `val` too where the module logs it at every validation, and on `init` alone
    where it is measured before the first step."""
    task, model = cfg.task, cfg.model
    transformer = model.arch == "transformer"
    cross_attends = FAMILIES[model.arch].cross_attends(model)
    reports = {  # each of the registry's `reported_for`
        "every trial": True,
        "text tasks": TASKS[task.name].text,
        "aligned tasks": TASKS[task.name].aligned and cross_attends,
        "Transformers": transformer,
        "encoders": transformer and model.cross_attention,  # a Transformer builds one only to cross-attend
        "feed-forwards": transformer and model.ffn,
        # an encoder exists only to cross-attend
        "attending": transformer and (model.cross_attention or model.decoder_self_attention),
        "labelled tasks": TASKS[task.name].labelled,
        "attention pooling": FAMILIES[model.arch].classifies and model.pooling == "attention",
        "aligned classifiers": FAMILIES[model.arch].classifies and TASKS[task.name].aligned and cross_attends,
    }
    reported = [m for m in METRICS.values() if reports[m.reported_for]]
    validated = {f"val/{m.name}" for m in reported if m.every_split}
    initial = {f"init/{m.name}" for m in reported if m.computed_by == "initialisation"}
    tested = [m for m in reported if m.computed_by != "initialisation"]
    return validated | initial | {f"{split}/{m.name}" for split in task.test_splits for m in tested}
