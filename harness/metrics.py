"""Scores of decoded outputs: exact match, token accuracy, accuracy by target length, BLEU / chrF
(sacrebleu) for text tasks, and the alignment error rate of attention against gold alignments; and which
of them, by name, a configuration's trials report (`produced_metrics`).

Prediction rows are (prediction ids, target ids) as Seq2SeqModule.predictions[split] holds them;
ids after EOS, padding and BOS are ignored, so raw decoder output works as well as trimmed rows."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import sacrebleu

from harness.config import ExperimentConfig
from harness.tasks import ALIGNED_TASKS, GENERATED_TASKS, TEXT_TASKS
from harness.tasks.base import TaskData, Vocab

Row = tuple[Sequence[int], Sequence[int]]  # (prediction ids, target ids)
Alignment = Iterable[tuple[int, int]]  # (source index, target index) pairs


def _scores(rows: Iterable[Row]) -> list[tuple[int, bool, int]]:
    """Per row: target length, exact match, target positions the prediction gets right."""
    out = []
    for pred, tgt in rows:
        pred, tgt = Vocab.strip_ids(pred), Vocab.strip_ids(tgt)
        out.append((len(tgt), pred == tgt, sum(p == t for p, t in zip(pred, tgt))))
    return out


def _summary(scores: list[tuple[int, bool, int]]) -> dict[str, float]:
    positions = sum(length for length, _, _ in scores)
    return {
        "n": len(scores),
        "seq_acc": sum(exact for _, exact, _ in scores) / len(scores) if scores else math.nan,
        "tok_acc": sum(correct for _, _, correct in scores) / positions if positions else math.nan,
    }


def exact_match(rows: Iterable[Row]) -> float:
    return _summary(_scores(rows))["seq_acc"]


def token_accuracy(rows: Iterable[Row]) -> float:
    """Share of target positions where the prediction has the target token (a prediction that is
    too short misses the rest; one that is too long is not rewarded for it)."""
    return _summary(_scores(rows))["tok_acc"]


def accuracy_by_length(rows: Iterable[Row], bucket_width: int = 1) -> list[dict[str, Any]]:
    """Rows of {length_min, length_max, n, seq_acc, tok_acc} per bucket of target lengths (tokens,
    without EOS), shortest first; only buckets that hold examples appear."""
    buckets: dict[int, list] = defaultdict(list)
    for score in _scores(rows):
        buckets[score[0] // bucket_width].append(score)
    return [
        {"length_min": b * bucket_width, "length_max": (b + 1) * bucket_width - 1, **_summary(scores)}
        for b, scores in sorted(buckets.items())
    ]


def bleu(hypotheses: list[str], references: list[str]) -> float:
    """Corpus BLEU (sacrebleu defaults: 13a tokenization, 0-100)."""
    return sacrebleu.corpus_bleu(hypotheses, [references]).score


def chrf(hypotheses: list[str], references: list[str]) -> float:
    """Corpus chrF (character 6-grams, beta 2; 0-100)."""
    return sacrebleu.corpus_chrf(hypotheses, [references]).score


def text_metrics(split: str, rows: Sequence[Row], data: TaskData) -> dict[str, float]:
    """{split}/bleu and {split}/chrf for a text task ({} otherwise). Rows must be in the order of
    data.splits[split], as the DataModule's evaluation loaders give them; references come from the
    examples, so target words outside the vocabulary are scored as written, not as <unk>."""
    examples = data.splits[split]
    if not data.is_text or not rows:
        return {}
    if len(rows) != len(examples):
        raise ValueError(f"{split}: {len(rows)} prediction rows for {len(examples)} examples")
    hypotheses = [data.target_text(data.tgt_vocab.decode(pred)) for pred, _ in rows]
    references = [data.target_text(ex.tgt) for ex in examples]
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
    attentions: Sequence[Any], gold: Sequence[Alignment], sizes: Sequence[tuple[int, int]] | None = None
) -> float:
    """Corpus AER (Och & Ney 2003) of attention argmax alignments against gold alignments, with every
    gold link sure: 1 - 2 |A & G| / (|A| + |G|). 0 is perfect; attention that ignores the gold gives 1.

    attentions: per example a (T, S) array or tensor, rows target positions, columns source positions.
    gold: per example (source index, target index) pairs, as in Example.alignment.
    sizes: optional (source length, target length) per example, see `attention_alignment`."""
    if len(attentions) != len(gold):
        raise ValueError(f"{len(attentions)} attention matrices for {len(gold)} gold alignments")
    hits = predicted = sure = 0
    for i, (weights, links) in enumerate(zip(attentions, gold)):
        src_len, tgt_len = sizes[i] if sizes is not None else (None, None)
        links = {(int(s), int(t)) for s, t in links}
        shape = np.shape(weights)
        if any(s >= shape[1] or t >= shape[0] for s, t in links):
            raise ValueError(
                f"example {i}: gold links outside its attention matrix of shape {tuple(shape)} (T, S)"
            )
        hard = attention_alignment(weights, src_len, tgt_len)
        hits += len(hard & links)
        predicted += len(hard)
        sure += len(links)
    return 1 - 2 * hits / (predicted + sure) if predicted + sure else math.nan


# Every split's teacher-forced loss / perplexity and greedy (or beam) exact match and token accuracy.
EVERY_SPLIT = ("loss", "ppl", "seq_acc", "tok_acc")


def produced_metrics(cfg: ExperimentConfig) -> set[str]:
    """The `split/name` metrics a trial of `cfg` reports (run_trial): EVERY_SPLIT on `val` and the test
    splits (`test_long` only where the task makes one); on the test splits BLEU / chrF for text tasks, AER
    where the task has gold alignments and the model cross-attends, rank collapse for Transformers (of the
    encoder only where one is built)."""
    task, model = cfg.task, cfg.model
    long_split = (task.name in GENERATED_TASKS and task.long_max_len > task.max_len) or (
        task.name == "parallel" and task.max_tokens is not None
    )
    test_splits = ["test", "test_long"] if long_split else ["test"]
    transformer = model.arch == "transformer"
    cross_attends = model.cross_attention if transformer else model.attention != "none"
    names = list(EVERY_SPLIT)
    if task.name in TEXT_TASKS:
        names += ["bleu", "chrf"]
    if task.name in ALIGNED_TASKS and cross_attends:
        names.append("aer")
    if transformer:
        names += ["rank_collapse_decoder", *(["rank_collapse_encoder"] if model.cross_attention else [])]
    return {f"val/{n}" for n in EVERY_SPLIT} | {f"{split}/{n}" for split in test_splits for n in names}
