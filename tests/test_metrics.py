"""harness.metrics against hand-computed values."""

import math

import numpy as np
import pytest
import sacrebleu
import torch

from ablate.harness.metrics import (
    Row,
    TextScore,
    alignment_error_rate,
    bleu,
    bleu_by_length,
    chrf,
    length_buckets,
    length_table,
    produced_metrics,
    translation_scores,
    translations,
)
from ablate.harness.tasks import build_task
from ablate.harness.tasks.base import Example, TaskData, Vocab
from ablate.harness.tasks.tokenizers import WordTokenizer, build_tokenizer
from ablate.models.sequences import BOS_ID, EOS_ID, PAD_ID, score, summarise
from ablate.schema.config import build_config
from ablate.schema.task_config import TaskConfig

E, P = EOS_ID, PAD_ID
# (prediction, target) as the decoder emits and the data holds them: EOS kept, then padding. The definition
# under test: a sequence runs through its first EOS; token accuracy counts the reference's positions
# through EOS, position by position; exact match is equality through EOS.
ROWS = [
    ([5, 6, 7, E, P, P], [5, 6, 7, E, P]),  # right, padding on both sides: 4 of 4, exact
    ([5, 6, E, P], [5, 6, 7, E]),  # stops early: EOS where 7 belongs, the reference's EOS missing: 2 of 4
    ([5, 6, 7, 8, E], [5, 6, 7, E, P, P]),  # one too long: 8 where EOS belongs: 3 of 4
    ([4, 4, 4, 4, 4, 4], [4, 4, E]),  # never emits EOS: 4 where EOS belongs: 2 of 3
    ([4, E, 9, 9], [BOS_ID, 4, E]),  # junk after EOS and a BOS are not tokens: 2 of 2, exact
    ([E, P, P], [5, 5, 5, 5, 5, E]),  # empty: its EOS against the first 5: 0 of 6
]
CORRECT, COUNTED = 4 + 2 + 3 + 2 + 2 + 0, 4 + 4 + 4 + 3 + 2 + 6


# The rows' scores as the module and the evaluation sum them (models.sequences' score and summarise).
def exact_match(rows: list[Row]) -> float:
    return summarise([score(*row) for row in rows])["seq_acc"]


def token_accuracy(rows: list[Row]) -> float:
    """Share of target positions, EOS included, where the prediction has the target token (a prediction
    that is too short misses the rest; one that is too long is not rewarded for it)."""
    return summarise([score(*row) for row in rows])["tok_acc"]


def accuracy_by_length(rows: list[Row], bucket_width: int = 1) -> list[dict]:
    return length_table([score(*row) for row in rows], bucket_width)


def test_exact_match_and_token_accuracy():
    assert exact_match(ROWS) == pytest.approx(2 / 6)
    assert token_accuracy(ROWS) == pytest.approx(CORRECT / COUNTED)  # 13 / 23
    assert math.isnan(exact_match([])) and math.isnan(token_accuracy([]))


def test_an_early_eos_costs_the_reference_positions_it_skips():
    assert token_accuracy([([5, E], [5, 6, 7, E])]) == pytest.approx(1 / 4)
    assert token_accuracy([([5, 6, 7], [5, 6, 7, E])]) == pytest.approx(3 / 4)  # no EOS: one short
    assert exact_match([([5, 6, 7], [5, 6, 7, E])]) == 0.0
    assert exact_match([([5, 6, 7, E, 7], [5, 6, 7, E])]) == 1.0


def test_each_row_scores_through_the_references_eos():
    # models.sequences.score is the one definition: the module's sums and these functions both use it.
    scores = [score(pred, tgt) for pred, tgt in ROWS]
    assert [s.counted for s in scores] == [4, 4, 4, 3, 2, 6]
    assert [s.correct for s in scores] == [4, 2, 3, 2, 2, 0]
    assert [s.length for s in scores] == [3, 3, 3, 2, 1, 5]  # without EOS
    assert [s.exact for s in scores] == [True, False, False, False, True, False]


def test_accuracy_by_target_length_buckets():
    # Buckets by target length without EOS; tok_acc counts EOS positions as token_accuracy does.
    assert accuracy_by_length(ROWS) == [
        {"length_min": 1, "length_max": 1, "n": 1, "seq_acc": 1.0, "tok_acc": 1.0, "tokens": 2},
        {"length_min": 2, "length_max": 2, "n": 1, "seq_acc": 0.0, "tok_acc": 2 / 3, "tokens": 3},
        {"length_min": 3, "length_max": 3, "n": 3, "seq_acc": 1 / 3, "tok_acc": 9 / 12, "tokens": 12},
        {"length_min": 5, "length_max": 5, "n": 1, "seq_acc": 0.0, "tok_acc": 0.0, "tokens": 6},
    ]
    wide = accuracy_by_length(ROWS, bucket_width=4)
    assert [(b["length_min"], b["length_max"], b["n"], b["tokens"]) for b in wide] == [
        (0, 3, 5, 17),
        (4, 7, 1, 6),
    ]
    assert wide[0]["seq_acc"] == pytest.approx(2 / 5)
    assert wide[0]["tok_acc"] == pytest.approx(13 / 17)
    assert sum(b["tokens"] for b in wide) == COUNTED


def test_bleu_and_chrf_against_hand_computed_values():
    # n-gram precisions 5/6, 4/5, 3/4, 2/3 and no brevity penalty: BLEU = (1/3) ** (1/4).
    assert bleu(["a b c d e g"], ["a b c d e f"]).value == pytest.approx(100 * (1 / 3) ** 0.25)
    assert bleu(["the cat sat on the mat"], ["the cat sat on the mat"]).value == pytest.approx(100)
    assert bleu(["the cat sat"], ["the cat sat"]).value == 0.0  # no 4-grams: corpus BLEU has nothing to count
    assert chrf(["the cat sat"], ["the cat sat"]).value == pytest.approx(100)
    assert chrf(["xyz"], ["abc"]).value == pytest.approx(0)


def test_bleu_and_chrf_are_sacrebleu_scores_with_their_signatures():
    hypotheses = ["The cat sat on the mat.", "It isn't raining, is it?"]
    references = ["The cat sat on a mat.", "It isn't raining, is it?"]
    version = sacrebleu.__version__
    assert bleu(hypotheses, references) == TextScore(
        sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a").score,
        f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{version}",
    )
    assert chrf(hypotheses, references) == TextScore(
        sacrebleu.corpus_chrf(hypotheses, [references]).score,
        f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{version}",
    )


def text_task(tokenizer, references: list[str], hypotheses: list[str]) -> tuple[TaskData, list]:
    """A test split of `references` tokenized by `tokenizer`, and prediction rows that decode to the tokens
    of `hypotheses`."""
    examples = [Example(("x",), tuple(tokenizer.tokenize(text))) for text in references]
    predicted = [tokenizer.tokenize(text) for text in hypotheses]
    vocab = Vocab(
        sorted({t for ex in examples for t in ex.tgt} | {t for tokens in predicted for t in tokens})
    )
    data = TaskData("parallel", {"test": examples}, vocab, vocab, is_text=True, tgt_tokenizer=tokenizer)
    return data, [(vocab.encode(tokens), vocab.encode(ex.tgt)) for tokens, ex in zip(predicted, examples)]


REFERENCES = ["The cat sat on the mat.", "Don't stop now!"]
HYPOTHESES = ["The cat sat on a mat.", "Don't stop!"]


@pytest.mark.parametrize(
    "kind, detokenized",
    [
        # Words and punctuation runs come back joined by spaces; sacreBLEU's 13a splits them again.
        (
            "word",
            (
                ["The cat sat on a mat .", "Don ' t stop !"],
                ["The cat sat on the mat .", "Don ' t stop now !"],
            ),
        ),
        ("char", (HYPOTHESES, REFERENCES)),  # characters, spaces included, joined as they were
        ("bpe", (HYPOTHESES, REFERENCES)),  # Metaspace BPE decodes to the text it was given
    ],
)
def test_translations_score_the_text_the_task_tokenizer_detokenizes(kind, detokenized):
    tokenizer = build_tokenizer(kind, REFERENCES + HYPOTHESES, bpe_vocab_size=40)
    data, rows = text_task(tokenizer, REFERENCES, HYPOTHESES)
    hypotheses, references = detokenized
    version = sacrebleu.__version__
    assert translation_scores("test", translations("test", rows, data)) == {
        "test/bleu": TextScore(sacrebleu.corpus_bleu(hypotheses, [references], tokenize="13a").score,
                               f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{version}"),
        "test/chrf": TextScore(sacrebleu.corpus_chrf(hypotheses, [references]).score,
                               f"nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:{version}"),
    }  # fmt: skip


def test_translations_score_detokenized_output_against_the_written_references():
    examples = [
        Example(("a",), ("le", "chat", "est", "sur", "le", "tapis")),
        Example(("b",), ("salut", "mon", "ami", "toi")),
    ]
    vocab = Vocab(["le", "chat", "est", "sur", "tapis", "salut", "mon", "ami"])  # "toi" is out of vocabulary
    data = TaskData("parallel", {"test": examples}, vocab, vocab, is_text=True, tgt_tokenizer=WordTokenizer())
    ids = [vocab.encode(ex.tgt) for ex in examples]
    rows = [(ids[0], ids[0]), (ids[1], ids[1])]  # the model got everything it could express
    scores = translation_scores("test", translations("test", rows, data))
    hypotheses = ["le chat est sur le tapis", "salut mon ami <unk>"]
    references = ["le chat est sur le tapis", "salut mon ami toi"]
    assert scores == {"test/bleu": bleu(hypotheses, references), "test/chrf": chrf(hypotheses, references)}
    assert 50 < scores["test/bleu"].value < 100
    assert translation_scores("test", []) == {}  # no translations: a task that is not text
    with pytest.raises(ValueError, match="1 prediction rows for 2 examples"):
        translations("test", rows[:1], data)


def test_bleu_by_length_is_sacrebleus_corpus_bleu_of_each_bucket():
    hypotheses = ["the cat sat on the mat", "a dog ran in the park today", "it rains", "we sat on a mat",
                  "the old man and the sea went out", "birds sing in the morning light"]  # fmt: skip
    references = ["the cat sat on a mat", "a dog ran in the park", "it is raining", "we sat on the mat",
                  "the old man and the sea went out", "birds sing in the early morning light"]  # fmt: skip
    lengths = [6, 12, 2, 5, 14, 9]  # source lengths: buckets 0-4 (one), 5-9 (three), 10-14 (two)
    rows = bleu_by_length(hypotheses, references, lengths, [(0, 4), (5, 9), (10, 14), (15, 19)])
    by_hand = {0: [2], 5: [0, 3, 5], 10: [1, 4]}
    assert [(r["length_min"], r["length_max"], r["n"]) for r in rows] == [(0, 4, 1), (5, 9, 3), (10, 14, 2)]
    for row in rows:
        members = by_hand[row["length_min"]]
        expected = sacrebleu.corpus_bleu([hypotheses[i] for i in members], [[references[i] for i in members]],
                                         tokenize="13a").score  # fmt: skip
        assert row["bleu"] == pytest.approx(expected)
    assert 0 < rows[1]["bleu"] < 100 and rows[0]["bleu"] == 0.0  # "it rains" shares no 4-gram, nor bigram
    # Corpus BLEU is no average of its buckets', so the rows do not give the whole test set's BLEU back.
    assert bleu(hypotheses, references).value != pytest.approx(np.mean([r["bleu"] for r in rows]))


def test_length_buckets_pool_sparse_tails_into_wider_buckets():
    lengths = [3] * 2 + [12] * 30 + [25] * 40 + [31] * 5 + [47] * 6 + [95]
    assert length_buckets(lengths) == [(0, 9), (10, 19), (20, 29), (30, 39), (40, 49), (90, 99)]
    # Fewer than 10 a bucket: 0-9 joins 10-19; 90-99 (1) joins 40-49 (6), which is still short of 10 and
    # joins 30-39 (5): the sparsest always joins its sparser neighbour.
    assert length_buckets(lengths, min_sentences=10) == [(0, 19), (20, 29), (30, 99)]
    assert length_buckets(lengths, width=50, min_sentences=10) == [(0, 99)]
    assert length_buckets([7, 8], min_sentences=10) == [(0, 9)]  # one bucket stays, however small


def test_translations_keep_source_lengths_beside_the_scored_texts():
    tokenizer = build_tokenizer("word", REFERENCES + HYPOTHESES, bpe_vocab_size=40)
    data, rows = text_task(tokenizer, REFERENCES, HYPOTHESES)
    data.splits["test"] = [Example(("x",) * (i + 3), ex.tgt) for i, ex in enumerate(data.splits["test"])]
    assert translations("test", rows, data) == [
        {"src_len": 3, "hyp": "The cat sat on a mat .", "ref": "The cat sat on the mat ."},
        {"src_len": 4, "hyp": "Don ' t stop !", "ref": "Don ' t stop now !"},
    ]
    assert translations("test", rows, build_task(TaskConfig(name="copy", n_train=5), 0)) == []


def test_alignment_error_rate_of_attention_argmax():
    diagonal = np.eye(4) + 0.01
    copy_gold = [(i, i) for i in range(4)]
    reverse_gold = [(3 - i, i) for i in range(4)]
    assert alignment_error_rate([diagonal], [copy_gold]) == 0.0
    assert alignment_error_rate([torch.tensor(diagonal)], [reverse_gold]) == 1.0
    # Two examples pooled: 4 + 4 predicted links, 4 + 4 gold links, 4 + 0 shared.
    assert alignment_error_rate([diagonal, diagonal], [copy_gold, reverse_gold]) == pytest.approx(1 - 8 / 16)
    # Rows and columns past the sizes are EOS: a target row that attends to EOS links nowhere.
    with_eos = np.array([[0.9, 0.0, 0.0, 0.1], [0.0, 0.8, 0.0, 0.2], [0.0, 0.1, 0.2, 0.7], [0, 0, 0, 1.0]])
    gold = [(0, 0), (1, 1), (2, 2)]
    assert alignment_error_rate([with_eos], [gold], sizes=[(3, 3)]) == pytest.approx(1 - 2 * 2 / (2 + 3))
    assert alignment_error_rate([with_eos], [gold]) == pytest.approx(1 - 2 * 2 / (4 + 3))
    with pytest.raises(ValueError, match="outside its attention matrix"):
        alignment_error_rate([np.eye(2)], [[(2, 0)]])


def test_alignment_error_rate_ignores_target_rows_past_the_target_length():
    # 3 target rows for 2 real target tokens; the third row (padding) points at a gold source position
    # but must not count: 2 predicted links, 1 of them gold; gold has 2 links.
    weights = np.array([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.0, 1.0, 0.0]])
    gold = [(0, 0), (1, 1)]
    assert alignment_error_rate([weights], [gold], sizes=[(3, 2)]) == pytest.approx(1 - 2 * 1 / (2 + 2))
    assert alignment_error_rate([weights], [gold]) == pytest.approx(1 - 2 * 1 / (3 + 2))  # all 3 rows
    # Rows are target positions even when the matrix is not square (4 targets over 2 sources).
    tall = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    assert alignment_error_rate([tall], [[(0, 0), (1, 1), (1, 2), (0, 3)]]) == 0.0


def test_alignment_error_rate_takes_tensors_that_require_grad_and_checks_its_inputs():
    weights = torch.eye(3, requires_grad=True)
    assert alignment_error_rate([weights], [[(0, 0), (1, 1), (2, 2)]]) == 0.0
    with pytest.raises(ValueError, match="2 attention matrices for 1 gold alignments"):
        alignment_error_rate([np.eye(2), np.eye(2)], [[(0, 0)]])
    tall = np.ones((3, 2))
    assert alignment_error_rate([tall], [[(0, 2)]]) == pytest.approx(1 - 2 * 1 / (3 + 1))  # target 2 < T = 3
    with pytest.raises(ValueError, match=r"shape \(3, 2\)"):
        alignment_error_rate([tall], [[(0, 3)]])  # target 3 is past the last row
    # No gold links and no predicted ones (every row points past the source): undefined, not 1 or 0.
    assert math.isnan(alignment_error_rate([np.eye(2)], [[]], sizes=[(0, 2)]))


def test_length_table_keeps_each_target_length_apart_by_default():
    # The per-length table of every trial (harness/evaluation.py) uses the default: one length a bucket.
    rows = length_table([score([4, EOS_ID], [4, EOS_ID]), score([4, 5, EOS_ID], [4, 6, EOS_ID])])
    assert [(r["length_min"], r["length_max"], r["n"]) for r in rows] == [(1, 1, 1), (2, 2, 1)]


EVERY = {"loss", "ppl", "seq_acc", "tok_acc"}


@pytest.mark.parametrize(
    "preset, task, model, splits, names",
    [
        # An encoder-decoder Transformer on an aligned task with longer test inputs: AER, both collapses.
        ("transformer", {"name": "reverse"}, {}, ("test", "test_long"),
         {"aer", "rank_collapse_encoder", "rank_collapse_decoder"}),
        # No cross-attention: no encoder to collapse, no alignment to score; synthetic translation is text.
        ("transformer", {"name": "synth_mt"}, {"cross_attention": False}, ("test", "test_long"),
         {"bleu", "chrf", "rank_collapse_decoder"}),
        ("lstm-bahdanau", {"name": "synth_mt"}, {}, ("test", "test_long"), {"bleu", "chrf", "aer"}),
        # No attention: no AER; test inputs no longer than training's: no test_long.
        ("lstm", {"name": "synth_mt", "min_len": 2, "max_len": 6, "test_max_len": 6}, {}, ("test",),
         {"bleu", "chrf"}),
        ("lstm-bahdanau", {"name": "addition"}, {}, ("test", "test_long"), set()),  # no gold alignment
        # A corpus has a test_long split only when max_tokens keeps the longer pairs out of training.
        ("lstm", {"name": "parallel", "path": "pairs.tsv", "max_tokens": 20}, {}, ("test", "test_long"),
         {"bleu", "chrf"}),
        ("lstm", {"name": "parallel", "path": "pairs.tsv"}, {}, ("test",), {"bleu", "chrf"}),
        # ... or long_after sets the boundary itself, training on every length.
        ("lstm", {"name": "parallel", "path": "pairs.tsv", "long_after": 20}, {}, ("test", "test_long"),
         {"bleu", "chrf"}),
        ("lstm", {"name": "scan"}, {}, ("test",), set()),  # SCAN's length split is its test split
    ],
)  # fmt: skip
def test_produced_metrics_follow_the_task_and_the_model(preset, task, model, splits, names):
    cfg = build_config({"preset": preset, "task": task, "model": model})
    expected = {f"val/{n}" for n in EVERY} | {f"{split}/{n}" for split in splits for n in EVERY | names}
    if preset == "transformer":  # the model before its first step (models/diagnostics.py)
        expected |= {"init/grad_last", "init/grad_growth", "init/attn_entropy"}
    assert produced_metrics(cfg) == expected
