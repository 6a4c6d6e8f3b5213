"""Seeds fused into one model (models/ensemble.py) against the same seeds trained alone.

The main check, for every model switch: K = 4 seeds, each with its own initialisation, its own batches
(different lengths, so different padding once stacked) and its own dropout (p = 0.3 at every site), train
fused for a few AdamW steps with gradient clipping that clips; each seed's parameters then equal those of
its model trained alone with torch's own clip_grad_norm_, to 1e-5. Around it: one seed fused is the plain
model, the layer-at-a-time RNN is nn.LSTM / nn.GRU, a stopped seed stays where it stopped while the others
train on, and decoding a fused model decodes each seed as it decodes alone.
"""

from __future__ import annotations

import copy
from typing import get_args

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ablate.models import build_model
from ablate.models.config import LSTM_KEYS, TRANSFORMER_KEYS, ModelConfig
from ablate.models.decoding import beam_search, greedy_decode
from ablate.models.ensemble import (
    ENSEMBLE_LAYERS,
    ActiveSeeds,
    Ensemble,
    clip_grad_norm_per_seed,
    fuse_models,
    fuse_modules,
    seed_dropout,
    seed_state_dict,
)
from ablate.models.kinds import CAPTIONER_KEYS, CLASSIFIER_KEYS
from ablate.models.positional import POSITIONAL
from ablate.models.rnn import RNN
from ablate.models.scores import SCORES
from ablate.models.sequences import BOS_ID, EOS_ID, PAD_ID
from ablate.models.steps import seed_losses, training_loss
from ablate.models.transformer_scores import TRANSFORMER_SCORES

pytestmark = pytest.mark.usefixtures("single_thread")

VOCAB, B = 12, 3
SEEDS = [11, 12, 13, 14]  # initialisation, one per fused seed
DROPOUT_SEEDS = [21, 22, 23, 24]
STEPS, LR, MAX_NORM, TOL = 3, 1e-3, 0.05, 1e-5  # MAX_NORM: below every gradient norm here (checked)
# AdamW's eps above the rounding noise of gradients that are zero in exact arithmetic (a key bias under a
# dot-product score: softmax ignores a shift shared by all keys), which eps = 1e-8 would turn into steps as
# large as any; lr 1e-3 keeps the model without norms from growing float rounding past TOL in three steps.
EPS = 1e-6

TRANSFORMER = dict(arch="transformer", d_model=16, layers=2, heads=2, d_ff=32, dropout=0.3, max_positions=16)
LSTM = dict(arch="lstm", d_model=16, layers=2, dropout=0.3, attention="dot", max_positions=16)
CLASSIFIER = dict(arch="classifier", d_model=16, layers=2, heads=2, d_ff=32, dropout=0.3, max_positions=16,
                  pooling="attention", attention="additive")  # fmt: skip
CAPTIONER = dict(arch="captioner", d_model=16, layers=2, dropout=0.3, attention="additive", doubly_stochastic=0.5,
                 max_positions=16)  # fmt: skip
BASES = {"transformer": TRANSFORMER, "lstm": LSTM, "classifier": CLASSIFIER, "captioner": CAPTIONER}


def values(key: str) -> tuple:
    """The names a config key accepts (its Literal), so that a new value is covered here by itself."""
    return get_args(ModelConfig.model_fields[key].annotation)


def flipped(key: str) -> dict:
    return {key: not ModelConfig.model_fields[key].default}


SWITCHES = {
    "transformer": [
        *({"pos_encoding": kind} for kind in [*POSITIONAL, "alibi+sinusoidal"]),
        {"pos_encoding": "learned", "pos_init": "embedding"}, {"pos_encoding": "t5", "causal_mask": False},
        *({"score": score} for score in TRANSFORMER_SCORES),
        {"score": "cosine", "scale": 3.0}, {"scale": "none"}, {"scale": 0.5},
        *({"norm": norm} for norm in values("norm")),
        {"heads": 1}, {"heads": 4}, {"key_dim": 3}, {"key_dim": 4, "pos_encoding": "rope"},
        {"pos_encoding": "t5", "t5_buckets": 8, "t5_max_distance": 9},
        *(flipped(key) for key in ("causal_mask", "cross_attention", "decoder_self_attention", "qkv_projections", "ffn", "residual",
                                   "embed_scale", "tie_embeddings")),
    ],
    "lstm": [
        *({"attention": score} for score in ["none", *SCORES]),
        *({"attention": score, "attention_query": "previous"} for score in SCORES),
        *({"attention_query": query, "input_feeding": True} for query in values("attention_query")),
        {"attention_heads": 2}, {"attention": "additive", "attention_heads": 2},
        # Windows narrower than most sources, so that each seed's lengths place and clip its own.
        *({"attention_window": window, "attention_width": 1} for window in ("local-m", "local-p")),
        {"attention_window": "local-p", "attention": "general", "attention_query": "current",
         "attention_heads": 2},
        {"attention_window": "local-m", "attention_query": "current", "attention_width": 2},
        *({"cell": cell, "attention_query": "previous"} for cell in values("cell")),
        flipped("bidirectional"), flipped("tie_embeddings"),
    ],
    "classifier": [
        *({"encoder": encoder, "pooling": pooling} for encoder in values("encoder") for pooling in values("pooling")
          if (encoder, pooling) != ("embedding", "last")),
        *({"attention": score} for score in SCORES), {"attention_heads": 2},
        {"encoder": "transformer", "pos_encoding": "alibi", "norm": "pre"}, {"cell": "gru", "pooling": "last"},
    ],
    # Its decoder is the LSTM's, covered above; here what its regions and penalty change.
    "captioner": [
        {"attention": "none"}, {"doubly_stochastic": 0.0}, {"attention": "general", "attention_query": "current",
        "input_feeding": True, "attention_heads": 2}, {"cell": "gru", "layers": 1},
    ],
}  # fmt: skip
CASES = [
    pytest.param({**BASES[arch], **switch},
                 id=f"{arch}-" + "-".join(f"{k}={v}" for k, v in switch.items()))
    for arch, switches in SWITCHES.items() for switch in switches
]  # fmt: skip
# Keys that choose sizes or constants rather than a code path; the sizes above cover them.
NOT_SWITCHES = {"d_ff", "pos_base"}


def test_every_switch_of_both_families_is_a_case():
    covered = {key for switches in SWITCHES.values() for switch in switches for key in switch}
    assert (set(LSTM_KEYS) | set(TRANSFORMER_KEYS) | set(CLASSIFIER_KEYS) | set(CAPTIONER_KEYS)) - NOT_SWITCHES <= covered


def seed_batch(seed: int, step: int) -> dict[str, torch.Tensor]:
    """Seed `seed`'s own batch at a step, padded to its own longest: sources of up to 4 + seed tokens and
    targets of up to 5 - seed (with BOS / EOS), so the K batches stack with padding that differs by seed."""
    g = torch.Generator().manual_seed(100 * seed + step)
    longest_src, longest_tgt = 4 + seed, 5 - seed
    src_lengths = torch.randint(1, longest_src + 1, (B,), generator=g)
    tgt_lengths = torch.randint(1, longest_tgt + 1, (B,), generator=g)
    src_lengths[0], tgt_lengths[-1] = longest_src, longest_tgt
    src = torch.randint(4, VOCAB, (B, longest_src), generator=g)
    src = src.masked_fill(torch.arange(longest_src) >= src_lengths[:, None], PAD_ID)
    tgt = torch.randint(4, VOCAB, (B, longest_tgt + 2), generator=g)
    position = torch.arange(longest_tgt + 2)
    tgt[:, 0] = BOS_ID
    tgt = tgt.masked_fill(position == tgt_lengths[:, None] + 1, EOS_ID)
    tgt = tgt.masked_fill(position > tgt_lengths[:, None] + 1, PAD_ID)
    return {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}


def stacked(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """K batches of B -> one of K·B, seed-major, each padded to the longest of the K."""
    longest = {name: max(b[name].size(1) for b in batches) for name in batches[0]}
    return {
        name: torch.cat([F.pad(b[name], (0, longest[name] - b[name].size(1)), value=PAD_ID) for b in batches])
        for name in batches[0]
    }


def plain_models(cfg: ModelConfig, k: int) -> list[nn.Module]:
    """k plain models, each initialised under its own seed."""
    models = []
    for seed in SEEDS[:k]:
        torch.manual_seed(seed)
        models.append(build_model(cfg, VOCAB, VOCAB, PAD_ID))
    return models


def train_alone(model: nn.Module, seed: int, steps: int = STEPS) -> list[torch.Tensor]:
    """What a trial does: its batches, its dropout stream, its training loss (cross entropy, and a captioner's
    penalty), torch's clipping, AdamW. Returns the gradient norm of each step."""
    seed_dropout(model.train(), [DROPOUT_SEEDS[seed]])
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, eps=EPS)
    norms = []
    for step in range(steps):
        batch = seed_batch(seed, step)
        optimizer.zero_grad()
        training_loss(model, batch["src"], batch["tgt_in"], batch["tgt_out"], 0.0).backward()
        norms.append(nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM))
        optimizer.step()
    return norms


def train_fused(fused: nn.Module, k: int, steps: int = STEPS, stop: dict[int, int] | None = None):
    """The fused group's loop: the K batches stacked, the sum of per-seed losses (seed_losses), per-seed
    clipping, one AdamW. stop: {step: seed} stops a seed before that step. Returns each step's K norms and the optimizer."""
    seed_dropout(fused.train(), DROPOUT_SEEDS[:k])
    optimizer = torch.optim.AdamW(fused.parameters(), lr=LR, eps=EPS)
    active = ActiveSeeds(optimizer)
    norms = []
    for step in range(steps):
        if stop and step in stop:
            active.stop(stop[step])
        batch = stacked([seed_batch(seed, step) for seed in range(k)])
        optimizer.zero_grad()
        training = torch.ones(k, dtype=torch.bool)
        seed_losses(fused, batch["src"], batch["tgt_in"], batch["tgt_out"], 0.0, k, training)[0].backward()
        norms.append(clip_grad_norm_per_seed(fused, MAX_NORM, k))
        optimizer.step()
    return norms, optimizer


def assert_same_state(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert list(actual) == list(expected)
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], atol=TOL, rtol=0, msg=name)


# One of each torch layer a fused model holds K of, and an input for K of them (padding tokens included).
PLAIN_LAYERS = {
    nn.Linear: (lambda: nn.Linear(5, 3), lambda k: torch.randn(k * B, 4, 5)),
    nn.Embedding: (lambda: nn.Embedding(7, 3, PAD_ID), lambda k: torch.randint(0, 7, (k * B, 4))),
    nn.LayerNorm: (lambda: nn.LayerNorm(5), lambda k: torch.randn(k * B, 4, 5)),
    nn.RMSNorm: (lambda: nn.RMSNorm(5), lambda k: torch.randn(k * B, 4, 5)),
    nn.Conv2d: (lambda: nn.Conv2d(3, 4, 3, padding=1), lambda k: torch.randn(k * B, 3, 5, 6)),
}


@pytest.mark.parametrize("layer", ENSEMBLE_LAYERS, ids=lambda layer: layer.__name__)
def test_ensemble_layers_are_their_plain_layers_side_by_side(layer):
    """Each seed's rows of the ensemble layer's output, and its slice of every gradient, are its plain
    layer's; the padding row of an embedding gets no gradient from lookups, as nn.Embedding's."""
    make, inputs = PLAIN_LAYERS[layer]
    torch.manual_seed(0)
    plain = [make() for _ in SEEDS]
    with torch.no_grad():  # norms start at ones and zeros, embeddings with a zero padding row: differ
        for p in (p for module in plain for p in module.parameters()):
            p.normal_()
    fused = fuse_modules(copy.deepcopy(plain))
    x = inputs(len(SEEDS))
    out = fused(x)
    upstream = torch.randn_like(out)
    (out * upstream).sum().backward()
    for seed, module in enumerate(plain):
        rows = slice(seed * B, (seed + 1) * B)
        own = module(x[rows])
        (own * upstream[rows]).sum().backward()
        torch.testing.assert_close(out[rows], own)
        for name, p in module.named_parameters():
            torch.testing.assert_close(getattr(fused, name).grad[seed], p.grad, msg=name)


@pytest.mark.parametrize("switches", CASES)
def test_fused_seeds_train_as_each_seed_alone(switches):
    cfg = ModelConfig(**switches)
    alone = plain_models(cfg, len(SEEDS))
    fused = fuse_models(copy.deepcopy(alone))
    fused_norms, _ = train_fused(fused, len(SEEDS))
    for seed, model in enumerate(alone):
        norms = torch.stack(train_alone(model, seed))
        assert (norms > MAX_NORM).all()  # the clipping acts
        torch.testing.assert_close(torch.stack(fused_norms)[:, seed], norms, rtol=1e-4, atol=0)
        assert_same_state(seed_state_dict(fused, seed), model.state_dict())


@pytest.mark.parametrize(
    "switches", [TRANSFORMER, {**LSTM, "input_feeding": True}], ids=["transformer", "lstm"]
)
def test_one_seed_fused_is_the_plain_model(switches):
    """K = 1 builds the plain torch layers, so fusing one model changes nothing: the same parameters, the
    same outputs, and the fused loop (per-seed loss and clipping) trains it as the plain loop does."""
    cfg = ModelConfig(**switches)
    [model] = plain_models(cfg, 1)
    layers = {type(m) for m in model.modules() if next(m.parameters(recurse=False), None) is not None}
    assert layers <= {nn.Linear, nn.Embedding, nn.LayerNorm, nn.RMSNorm, RNN}
    fused = fuse_models([copy.deepcopy(model)])
    assert_same_state(fused.state_dict(), model.state_dict())
    batch = seed_batch(0, 0)
    with torch.no_grad():
        outputs = [m.eval()(batch["src"], batch["tgt_in"]) for m in (fused, model)]
    assert torch.equal(*outputs)
    train_fused(fused, 1)
    train_alone(model, 0)
    assert_same_state(fused.state_dict(), model.state_dict())


@pytest.mark.parametrize("cell", values("cell"))
@pytest.mark.parametrize("bidirectional", [False, True])
def test_plain_rnn_is_torchs_rnn(cell, bidirectional):
    """One seed's RNN, run a layer at a time, is nn.LSTM / nn.GRU: the same parameters from the same seed,
    and in training the same outputs and final states, its dropout between layers drawn from the global
    generator as theirs (packed sequences with padding, and unpacked ones from a given state)."""
    torch.manual_seed(0)
    torch_rnn = nn.LSTM if cell == "lstm" else nn.GRU
    theirs = torch_rnn(6, 4, 3, batch_first=True, dropout=0.4, bidirectional=bidirectional)
    torch.manual_seed(0)
    ours = RNN(cell, 6, 4, 3, Ensemble(), bidirectional=bidirectional, dropout=0.4)
    assert_same_state(ours.state_dict(), theirs.state_dict())
    x, lengths = torch.randn(5, 7, 6), torch.tensor([3, 7, 1, 5, 7])
    state = tuple(torch.randn(3 * (1 + bidirectional), 5, 4) for _ in range(1 + (cell == "lstm")))
    packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
    torch_state = state if cell == "lstm" else state[0]
    for args, kwargs in [((packed,), dict(lengths=lengths)), ((x, torch_state), dict(state=state))]:
        torch.manual_seed(1)
        out, final = theirs(*args)
        torch.manual_seed(1)
        our_out, our_final = ours(x, **kwargs)
        if isinstance(out, nn.utils.rnn.PackedSequence):
            out = nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=7)[0]
        assert torch.equal(our_out, out)
        assert all(map(torch.equal, our_final, final if cell == "lstm" else (final,)))


def test_tied_embeddings_stay_tied_fused():
    for base in (TRANSFORMER, LSTM):
        fused = fuse_models(plain_models(ModelConfig(**base, tie_embeddings=True), 2))
        assert fused.generator.weight is fused.tgt_embed.weight
        assert fused.generator.weight.shape == (2, VOCAB, 16)


def test_a_stopped_seed_stays_where_it_stopped_while_the_others_train_on():
    """Seed 2 stops after the first of four steps: its parameters and AdamW moments keep their values from
    then (weight decay and momentum would move them), while every other seed trains as it does alone."""
    k, stopped = 3, 2
    cfg = ModelConfig(**TRANSFORMER)
    alone = plain_models(cfg, k)
    fused = fuse_models(copy.deepcopy(alone))
    _, optimizer = train_fused(fused, k, steps=1)
    at_stop = {name: p[stopped].clone() for name, p in fused.named_parameters()}
    moments = {
        (name, moment): optimizer.state[p][moment][stopped].clone()
        for name, p in fused.named_parameters() for moment in ("exp_avg", "exp_avg_sq")
    }  # fmt: skip

    fused = fuse_models(copy.deepcopy(alone))
    _, optimizer = train_fused(fused, k, steps=4, stop={1: stopped})
    for name, p in fused.named_parameters():
        assert torch.equal(p[stopped], at_stop[name]), name
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(optimizer.state[p][moment][stopped], moments[name, moment]), name
    for seed in range(k):
        if seed != stopped:
            train_alone(alone[seed], seed, steps=4)
            assert_same_state(seed_state_dict(fused, seed), alone[seed].state_dict())


@torch.no_grad()
@pytest.mark.parametrize(
    "switches",
    [TRANSFORMER, {**TRANSFORMER, "causal_mask": False, "pos_encoding": "learned", "score": "cosine"},
     {**TRANSFORMER, "pos_encoding": "t5"},
     {**LSTM, "attention": "additive", "input_feeding": True}, {**LSTM, "attention": "none", "cell": "gru"},
     *({**LSTM, "attention_window": window, "attention_width": 1} for window in ("local-m", "local-p"))],
    ids=["transformer", "transformer-no-cache", "transformer-t5", "lstm-feeding", "gru-bottleneck",
         "lstm-local-m", "lstm-local-p"],
)  # fmt: skip
@pytest.mark.parametrize("beam", [1, 3])
def test_decoding_a_fused_model_decodes_each_seed_as_alone(switches, beam):
    """greedy_decode and beam_search on the K·B batch, unchanged; each seed's rows are its own decode."""
    alone = [model.eval() for model in plain_models(ModelConfig(**switches), len(SEEDS))]
    fused = fuse_models(copy.deepcopy(alone)).eval()
    sources = [seed_batch(seed, 0)["src"] for seed in range(len(SEEDS))]

    def decode(model, src):
        if beam == 1:
            return greedy_decode(model, src, BOS_ID, EOS_ID, PAD_ID, max_len=9)
        return beam_search(model, src, BOS_ID, EOS_ID, PAD_ID, beam_size=beam, max_len=9)

    together = decode(fused, stacked([{"src": src} for src in sources])["src"])
    for seed, (model, src) in enumerate(zip(alone, sources)):
        own = decode(model, src)
        assert torch.equal(together[seed * B : (seed + 1) * B, : own.size(1)], own)
        assert (together[seed * B : (seed + 1) * B, own.size(1) :] == PAD_ID).all()


def test_a_fused_model_refuses_dropout_without_its_seeds_generators():
    fused = fuse_models(plain_models(ModelConfig(**TRANSFORMER), 2)).train()
    batch = stacked([seed_batch(seed, 0) for seed in range(2)])
    with pytest.raises(RuntimeError, match=r"seed_dropout\(model, seeds\)"):
        fused(batch["src"], batch["tgt_in"])
    with pytest.raises(ValueError, match="3 seeds for a model of 2"):
        seed_dropout(fused, [1, 2, 3])
