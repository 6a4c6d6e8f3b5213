"""The classifier family (models/classifier.py), its tasks and Jain & Wallace's explanation measures
(models/explanation.py): each encoder and pooling learns the cues task; uniform attention is the mean; every
measure against values computed by hand here; macro-F1 and the rationale's mass; the refusals."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from conftest import fit
from torch import nn

from ablate.harness.artifacts import AttentionSample
from ablate.harness.attention_maps import labels_one, probe_figure
from ablate.harness.evaluation import predicted_label
from ablate.harness.metrics import macro_f1, rationale_mass
from ablate.harness.tasks import build_task
from ablate.harness.tasks.datamodule import Seq2SeqDataModule
from ablate.harness.tasks.synthetic import CUES
from ablate.models import build_model
from ablate.models.config import ModelConfig
from ablate.models.explanation import (
    adversarial,
    explain,
    gradient_importance,
    jsd,
    kendall,
    leave_one_out,
    permuted,
    tvd,
)
from ablate.models.kinds import ENCODERS, POOLINGS
from ablate.schema.config import load_config
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

pytestmark = pytest.mark.usefixtures("single_thread")

CUES_TASK = TaskConfig(name="cues", vocab_size=10, min_len=4, max_len=8, n_train=1500, n_valid=50, n_test=200)


def classifier(**keys) -> ModelConfig:
    return ModelConfig(**{"arch": "classifier", "d_model": 16, "layers": 1, "dropout": 0.0, "heads": 2,
                          "d_ff": 32, "attention": "additive", **keys})  # fmt: skip


@pytest.fixture(scope="module")
def cues():
    return build_task(CUES_TASK, 0)


def test_the_cues_task_labels_each_text_by_most_of_its_cues_and_points_at_them(cues):
    label_of = {cue: label for label, words in CUES.items() for cue in words}
    for ex in cues.splits["train"][:200] + cues.splits["test"]:
        places = [i for i, token in enumerate(ex.src) if token in label_of]
        votes = [label_of[ex.src[i]] for i in places]
        assert 1 <= len(votes) <= 3 and votes.count("positive") != votes.count("negative")
        assert ex.tgt == (max(CUES, key=votes.count),)
        assert ex.alignment == tuple((i, 0) for i in places)
    assert not {ex.src for ex in cues.splits["test"]} & {ex.src for ex in cues.splits["train"]}
    assert cues.target_ends is False and list(cues.tgt_vocab.itos[4:]) == sorted(CUES)


CASES = [(e, p) for e, p in itertools.product(ENCODERS, POOLINGS) if (e, p) != ("embedding", "last")]


@pytest.mark.parametrize(("encoder", "pooling"), CASES, ids=[f"{e}-{p}" for e, p in CASES])
def test_each_encoder_and_pooling_learns_the_cues_task(cues, encoder, pooling):
    """Chance is 0.5; max pooling of a text without context cannot count its cues (it sees which are there,
    not how many), so it is held to what telling one- and two-sided texts apart gives (13/16)."""
    torch.manual_seed(0)
    cfg = classifier(encoder=encoder, pooling=pooling)
    model = build_model(cfg, len(cues.src_vocab), len(cues.tgt_vocab))
    fit(model, cues, epochs=4, lr=0.01, batch_size=64)
    dm = Seq2SeqDataModule(cues, batch_size=64, seed=0)
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in dm.test_dataloader()[0]:
            logits = model(batch["src"], batch["tgt_in"])
            correct += int((logits[:, 0].argmax(-1) == batch["tgt_out"][:, 0]).sum())
            total += batch["src"].size(0)
    floor = 0.75 if (encoder, pooling) == ("embedding", "max") else 0.9
    assert correct / total >= floor


def test_uniform_attention_is_exactly_the_mean_of_the_states():
    torch.manual_seed(0)
    model = build_model(classifier(pooling="uniform"), 20, 6).eval()
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    states, padding, _, _ = model.encode(src)
    weights = model.pool_weights(states, padding)
    assert torch.equal(weights[1, 0, 0], torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0]))
    mean = torch.stack([states[0].mean(0), states[1, :3].mean(0)])
    torch.testing.assert_close(model.classify(states, weights), model.generator(mean))
    logits, cross = model(src, torch.ones(2, 1, dtype=torch.long), need_weights=True)
    torch.testing.assert_close(logits[:, 0], model.generator(mean))
    assert torch.equal(cross["cross"][0], weights)


def test_max_and_last_pool_the_real_states_alone():
    torch.manual_seed(0)
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])
    for encoder in ("transformer", "embedding"):
        net = build_model(classifier(encoder=encoder, pooling="max"), 20, 6).eval()
        states, _, last, _ = net.encode(src)
        torch.testing.assert_close(net.logits(src)[0][1], net.generator(states[1, :3].amax(0)))
        assert torch.equal(last[1], states[1, 2])
    lstm = build_model(classifier(pooling="last"), 20, 6).eval()
    alone = lstm.logits(src[1:, :3])[0]  # the padded row's last state is its own
    torch.testing.assert_close(lstm.logits(src)[0][1:], alone)


def test_kendall_tau_b_against_pairs_counted_by_hand():
    a, b = np.array([0.1, 0.4, 0.3, 0.2, 0.4]), np.array([1.0, 4.0, 2.0, 3.0, 5.0])
    signs = [(np.sign(a[i] - a[j]), np.sign(b[i] - b[j])) for i, j in itertools.combinations(range(5), 2)]
    concordant = sum(1 for sa, sb in signs if sa * sb > 0)
    discordant = sum(1 for sa, sb in signs if sa * sb < 0)
    untied_a, untied_b = sum(1 for sa, _ in signs if sa), sum(1 for _, sb in signs if sb)
    expected = (concordant - discordant) / math.sqrt(untied_a * untied_b)
    assert (concordant, discordant, untied_a, untied_b) == (8, 1, 9, 10)  # one pair tied in a
    assert kendall(a, b) == pytest.approx(expected) == pytest.approx(7 / math.sqrt(90))
    assert math.isnan(kendall(np.ones(3), b[:3])) and math.isnan(kendall(a[:1], b[:1]))


def test_tvd_and_jsd_against_their_formulas():
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.5, 0.5])
    assert float(tvd(p, q)) == pytest.approx(0.5)
    # M = (1/4, 1/2, 1/4): KL(P||M) = 1/2 log2 2 + 1/2 log2 1 = 1/2, KL(Q||M) the same.
    assert float(jsd(p, q)) == pytest.approx(0.5)
    assert float(jsd(p, p)) == 0.0
    assert float(jsd(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))) == pytest.approx(1.0)


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(3)
    model = build_model(classifier(encoder="lstm", pooling="attention"), 20, 6).eval()
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, 0, 0]])
    return model, src


def test_gradient_importance_is_gradient_times_input_by_finite_differences(tiny):
    """d/de of y(e_t scaled by 1 + eps) at 0 is (dy/de_t) . e_t: central differences in float64."""
    _, src = tiny
    torch.manual_seed(3)
    model = build_model(classifier(encoder="lstm", pooling="attention"), 20, 6).double().eval()
    importance = gradient_importance(model, src)
    eps, lengths = 1e-5, [5, 3]
    for row, length in enumerate(lengths):
        label = 2 + int(model.logits(src)[0][row, 2:].argmax())  # as decoded: never PAD (0) or BOS (1)

        def y(t: int, scale: float, row: int = row, label: int = label) -> float:
            at = (torch.tensor([row]), torch.tensor([t]))
            hook = model.embedding.register_forward_hook(
                lambda _m, _i, out: out.index_put(at, out[at] * scale)
            )
            try:
                with torch.no_grad():
                    return float(model.logits(src)[0].softmax(-1)[row, label])
            finally:
                hook.remove()

        raw = torch.tensor(
            [abs(y(t, 1 + eps) - y(t, 1 - eps)) / (2 * eps) for t in range(length)], dtype=torch.float64
        )
        torch.testing.assert_close(importance[row, :length].double(), raw / raw.sum(), rtol=1e-4, atol=1e-6)
        assert torch.all(importance[row, length:] == 0)


def test_leave_one_out_against_each_text_rebuilt_without_its_token(tiny):
    model, src = tiny
    probs = model.logits(src)[0].softmax(-1)
    loo = leave_one_out(model, src, probs)
    for row, length in enumerate([5, 3]):
        tokens = src[row, :length].tolist()
        for t in range(length):
            without = torch.tensor([tokens[:t] + tokens[t + 1 :]])
            expected = 0.5 * (model.logits(without)[0].softmax(-1)[0] - probs[row]).abs().sum()
            assert float(loo[row, t]) == pytest.approx(float(expected), abs=1e-6)
        assert torch.isnan(loo[row, length:]).all()


def test_permutation_is_the_median_change_over_shuffles_of_the_weights_among_real_tokens(tiny):
    """A text of two tokens has two orders, its own (no change) and the swap: over 20 shuffles the median is
    0, the swap's change, or their midpoint when as many shuffles fall each way; every other text's lies
    within the changes of its orders."""
    model, src = tiny
    src = torch.cat([src, torch.tensor([[11, 2, 0, 0, 0]])])
    states, padding, _, _ = model.encode(src)
    weights = model.pool_weights(states, padding)
    probs = model.classify(states, weights).softmax(-1)
    measured = permuted(model, src, states, weights, padding, probs)
    for row, length in enumerate([5, 3, 2]):
        changes = []
        for order in itertools.permutations(range(length)):
            shuffled = weights.clone()
            shuffled[row, :, :, :length] = weights[row, :, :, list(order)]
            changes.append(float(tvd(model.classify(states, shuffled).softmax(-1)[row], probs[row])))
        assert min(changes) - 1e-7 <= float(measured[row]) <= max(changes) + 1e-7
    swap = max(changes)
    assert swap > 1e-4 and any(abs(float(measured[2]) - c) < 1e-7 for c in (0.0, swap / 2, swap))
    # The same text alone, or padded wider, or beside others, draws the same shuffles.
    for row in range(3):
        alone = src[row : row + 1, : int(padding[row].sum())]
        s1, p1, _, _ = model.encode(alone)
        w1 = model.pool_weights(s1, p1)
        again = permuted(model, alone, s1, w1, p1, model.classify(s1, w1).softmax(-1))
        assert float(again[0]) == pytest.approx(float(measured[row]), abs=1e-6)
    # A classifier whose states are all alike cannot be moved by any order of its weights.
    same = states[:, :1].expand_as(states).contiguous()
    still = permuted(model, src, same, weights, padding, model.classify(same, weights).softmax(-1))
    assert torch.allclose(still, torch.zeros(3), atol=1e-6)


def test_an_adversary_reaches_the_largest_divergence_where_attention_cannot_move_the_output(tiny):
    """States all alike: every attention gives the same output, so the adversary may put all weight on one
    token; the farthest one-hot from the model's weights a (by hand: JSD(a, one-hot at the smallest a_i))
    bounds what it reaches. States far apart behind a steep output: it barely moves."""
    model, src = tiny
    states, padding, _, _ = model.encode(src)
    weights = model.pool_weights(states, padding)
    same = states[:, :1].expand_as(states).contiguous()
    probs = model.classify(same, weights).softmax(-1)
    reached = adversarial(model, src, same, weights, padding, probs)
    for row, length in enumerate([5, 3]):
        a = weights[row, :, 0, :length].mean(0)
        bound = max(float(jsd(a, torch.eye(length)[i])) for i in range(length))
        assert 0.8 * bound <= float(reached[row]) <= bound + 1e-6
    # By hand: token i's state is e_i and the output layer reads label i from it, so the logits are 10·a.
    steep = build_model(classifier(encoder="lstm", pooling="attention"), 20, 6).eval()
    with torch.no_grad():
        steep.generator.weight.zero_()
        steep.generator.bias.zero_()
        steep.generator.weight[:3, :3] = 10 * torch.eye(3)
    states, padding, even = (
        torch.eye(16)[None, :3],
        torch.ones(1, 3, dtype=torch.bool),
        torch.full((1, 1, 1, 3), 1 / 3),
    )
    probs = steep.classify(states, even).softmax(-1)
    moved = adversarial(steep, torch.tensor([[5, 6, 2]]), states, even, padding, probs)
    assert float(moved[0]) < 0.01


def test_explain_reports_every_measure_for_attention_pooling_and_importance_for_any(tiny):
    model, src = tiny
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    rng = torch.get_rng_state()
    found = explain(model.train(), src)  # dropout 0: the mode is what is kept, not what is measured
    assert set(found) == {"importance", "tau_grad", "tau_loo", "perm_tvd", "adv_jsd"}
    assert all(p.grad is None and torch.equal(p, before[name]) for name, p in model.named_parameters())
    assert model.training and torch.equal(torch.get_rng_state(), rng)
    model.eval()
    # A text's measures are its own, whatever batch it comes in.
    alone = explain(model, src[1:, :3])
    for name in ("tau_grad", "tau_loo", "perm_tvd", "adv_jsd"):
        assert float(alone[name][0]) == pytest.approx(float(found[name][1]), abs=1e-5), name
    for pooling in ("uniform", "max"):
        other = build_model(classifier(pooling=pooling), 20, 6).eval()
        assert set(explain(other, src)) == {"importance"}


def test_macro_f1_and_rationale_mass_against_hand_values():
    true = ["a", "a", "b", "b", "c"]
    predicted = ["a", "b", "b", "b", None]
    # a: 1 hit, 1 claimed, 2 true -> 2/3; b: 2 hits, 3 claimed, 2 true -> 4/5; c: 0 -> 0
    assert macro_f1(predicted, true) == pytest.approx((2 / 3 + 4 / 5 + 0) / 3)
    assert macro_f1(true, true) == 1.0
    # A classifier that emits `<unk>` or nothing predicts no label: wrong for its example, no class of its own.
    decoded = [["a"], ["b"], ["b"], ["<unk>"], []]
    assert [predicted_label(tokens) for tokens in decoded] == ["a", "b", "b", None, None]
    # a 2/3, b 1 hit of 2 claimed and 2 true -> 1/2, c 0; over three classes, not four with `<unk>`
    assert macro_f1([predicted_label(t) for t in decoded], true) == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)
    weights = [np.array([[0.5, 0.2, 0.3]]), np.array([[0.1, 0.9]])]
    assert rationale_mass(weights, [((0, 0), (2, 0)), ((1, 0),)]) == pytest.approx((0.8 + 0.9) / 2)


def test_a_classifiers_probe_is_its_text_shaded_by_attention_and_gradient():
    sample = AttentionSample(
        "test", ["good", "3", "bad", "</s>"], ["<s>"], ["positive"],
        {"cross": np.array([[[[0.6, 0.1, 0.2, 0.1]]]]), "importance": np.array([[[[0.5, 0.1, 0.3, 0.1]]]])},
        np.array([[0, 0], [2, 0]]),
    )  # fmt: skip
    assert labels_one(sample)
    fig = probe_figure(sample)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert texts.count("good") == 2 and texts.count("bad") == 2  # once per measure
    assert "attention (largest 0.60)" in texts and "gradient (largest 0.50)" in texts
    assert len(fig.axes[0].lines) == 4  # the two rationale tokens underlined in each block


def test_a_classifier_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError) as info:
        load_config(None, "classifier-additive", [])
    assert str(info.value).startswith(
        "model.arch: classifier predicts one label, so it cannot read task reverse, whose targets are sequences"
    )
    with pytest.raises(ConfigError, match=r"^model.attention: attention pooling needs a score"):
        load_config(None, None, ["model.arch=classifier", "model.pooling=attention", "task.name=cues"])
    with pytest.raises(ConfigError, match=r"^model.pooling: last reads the last token alone"):
        load_config(None, None, ["model.arch=classifier", "model.encoder=embedding", "model.pooling=last",
                                 "task.name=cues"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"^model.heads: has no effect \(acts only with a classifier's "
                                          r"transformer encoder; model.encoder is lstm\)"):  # fmt: skip
        load_config(None, "classifier-additive", ["model.heads=2", "task.name=cues"])
    with pytest.raises(ConfigError, match=r"^model.pooling: has no effect \(a classifier setting"):
        load_config(None, "lstm", ["model.pooling=max"])
    # A labelled task's target never ends (no EOS to learn): a decoder would not know where to stop.
    with pytest.raises(ConfigError, match=r"^task.name: cues's target is one label, which model.arch lstm "):
        load_config(None, "lstm-bahdanau", ["task.name=cues"])
    assert isinstance(build_model(classifier(), 9, 4), nn.Module)


def test_a_classifier_places_source_positions_alone_and_each_bound_counts():
    """It decodes one label: no target positions, so a task's decoding budget does not bound it; location
    attention's table bounds the source beside learned positions; a T5 encoder's buckets are checked on the
    source stack."""
    from ablate.harness.lengths import position_problem

    location = classifier(encoder="transformer", pooling="attention", attention="location", max_positions=8)
    assert location.position_limits == (8, None) and "max_positions" not in location.ignored_keys()
    learned = classifier(encoder="transformer", pos_encoding="learned", max_positions=42)
    assert learned.position_limits == (42, None)
    task = {"name": "cues", "vocab_size": 10, "min_len": 4, "max_len": 8, "test_max_len": 40, "n_train": 40,
            "n_valid": 8, "n_test": 8}  # fmt: skip
    for model, problem in (
        (learned, None),
        (learned.model_copy(update={"max_positions": 20}), "sources reach"),
    ):
        cfg = load_config(
            None, None, ["model.arch=classifier", *(f"task.{k}={v}" for k, v in task.items())]
        ).model_copy(update={"model": model})
        found = position_problem(cfg, build_task(cfg.task, 0))
        assert (found is None) if problem is None else problem in found[1]
    t5 = classifier(encoder="transformer", pos_encoding="t5", t5_buckets=32, t5_max_distance=128)
    cfg = load_config(
        None, None, ["model.arch=classifier", *(f"task.{k}={v}" for k, v in task.items())]
    ).model_copy(update={"model": t5})
    assert "leaves T5 buckets" in position_problem(cfg, build_task(cfg.task, 0))[1]
    assert "tie_embeddings" in classifier().ignored_keys()
    assert (
        "layers" in classifier(encoder="embedding").ignored_keys()
        and "layers" not in classifier().ignored_keys()
    )
