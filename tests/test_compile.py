"""Steps compiled whole (models/steps.py, `train.compile`): every model switch's training step traces as one
graph with its backward (`fullgraph=True`: a graph break fails), or is listed with its reason; compiled and
eager steps give the same numbers to float tolerance, the compiled side on its padded lengths; a run over
many lengths compiles a bounded number of times; a fused group compiles and trains under bf16 autocast.

Tracing is checked with dynamo's `aot_eager` backend (the graphs, forward and backward, without generating
code: a second or two a switch); the numbers of Inductor's generated code, under `-m slow`.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from test_fused import CASES, SEEDS, VOCAB, plain_models, seed_batch, stacked

from ablate.harness.fused import Member, run_fused
from ablate.harness.tasks import build_task
from ablate.harness.trial import data_module, run_trial
from ablate.models import build_model
from ablate.models import steps as steps_module
from ablate.models.config import ModelConfig
from ablate.models.ensemble import fuse_models
from ablate.models.sequences import PAD_ID
from ablate.models.steps import (
    EAGER_PARTS,
    LENGTH_MULTIPLE,
    Steps,
    compiles,
    loss_sums,
    padded_batch,
    seed_losses,
    training_loss,
    why_eager,
)
from ablate.schema.config import build_config

pytestmark = pytest.mark.usefixtures("single_thread")

# Every switch under -m slow (about two minutes); these in the default run, one of each kind of code path.
DEFAULT = {"transformer-pos_encoding=rope", "transformer-pos_encoding=t5", "transformer-pos_encoding=alibi",
           "transformer-score=cosine", "transformer-norm=rms_pre", "transformer-key_dim=3",
           "transformer-residual=False", "lstm-attention=additive", "classifier-encoder=lstm-pooling=attention",
           "classifier-encoder=transformer-pooling=attention", "classifier-encoder=embedding-pooling=max",
           "captioner-cell=gru-layers=1"}  # fmt: skip
FUSED_DEFAULT = {"transformer-pos_encoding=t5", "transformer-key_dim=3", "transformer-residual=False"}


def cases(default: set[str], prefix: str = "") -> list:
    return [c if c.id in default else pytest.param(*c.values, id=c.id, marks=pytest.mark.slow)
            for c in CASES if c.id.startswith(prefix)]  # fmt: skip


@pytest.fixture
def backend(monkeypatch):
    """Compiles with `aot_eager` and counts the graphs dynamo hands it (each one compilation)."""
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch.compiler.reset()
    monkeypatch.setattr(steps_module, "BACKEND", counting)
    monkeypatch.setattr(steps_module, "_COMPILED", {})  # steps compiled by an earlier test's backend
    yield graphs
    torch.compiler.reset()


def no_dropout(case: dict) -> ModelConfig:
    return ModelConfig(**{**case, "dropout": 0.0})


def loss_and_grads(fn, model, batch, *args):
    model.zero_grad(set_to_none=True)
    out = fn(model, batch["src"], batch["tgt_in"], batch["tgt_out"], *args)
    loss = out[0] if isinstance(out, tuple) else out
    loss.backward()
    return out, [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("case", cases(DEFAULT))
def test_every_switch_trains_compiled_whole_or_is_listed_with_its_reason(case, backend):
    cfg = no_dropout(case)
    torch.manual_seed(0)
    model = build_model(cfg, VOCAB, VOCAB, PAD_ID)
    batch = seed_batch(0, 0)
    padded = padded_batch(batch)  # the lengths of a compiled step: longer than the batch's own
    assert {name: t.size(1) for name, t in padded.items()} == {"src": 8, "tgt_in": 8, "tgt_out": 8}
    reason = why_eager(cfg)
    step = torch.compile(training_loss, fullgraph=True, backend=steps_module.BACKEND)
    if reason is not None:  # the listing is true: this model does not trace whole
        assert reason == EAGER_PARTS[f"model.arch: {cfg.arch}"]
        with pytest.raises(torch._dynamo.exc.Unsupported):
            step(model, padded["src"], padded["tgt_in"], padded["tgt_out"], 0.1)
        return
    (loss, grads), (eager_loss, eager_grads) = (
        loss_and_grads(step, model, padded, 0.1), loss_and_grads(training_loss, model, batch, 0.1)
    )  # fmt: skip
    assert len(backend) == 1  # one graph: forward and backward, no break
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for g, e in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)


def test_dropout_keeps_a_model_eager_and_says_why():
    cfg = ModelConfig(arch="transformer", dropout=0.1)
    assert why_eager(cfg) == EAGER_PARTS["model.dropout > 0"]
    assert not compiles(True, cfg, "cuda")
    plain = cfg.model_copy(update={"dropout": 0.0})
    assert compiles(True, plain, "cpu") and compiles("auto", plain, "cuda")
    assert not compiles("auto", plain, "cpu") and not compiles(False, plain, "cuda")


@pytest.mark.parametrize("case", cases(FUSED_DEFAULT, "transformer-"))
def test_a_fused_step_and_a_validation_compile_whole(case, backend):
    cfg = no_dropout(case)
    k = 2
    models = plain_models(cfg, k)
    fused = fuse_models([copy.deepcopy(m) for m in models])
    batch = stacked([seed_batch(s, 0) for s in range(k)])
    training = torch.tensor([True, False])
    step = torch.compile(seed_losses, fullgraph=True, backend=steps_module.BACKEND)
    (total, losses), grads = loss_and_grads(step, fused, padded_batch(batch), 0.0, k, training)
    (eager_total, eager_losses), eager_grads = loss_and_grads(seed_losses, fused, batch, 0.0, k, training)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(total, eager_losses[0])  # the stopped seed's loss stays out of the sum
    for g, e in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
    model = models[0].eval()
    with torch.no_grad():
        sums = torch.compile(loss_sums, fullgraph=True, backend=steps_module.BACKEND)(
            model, *padded_batch(seed_batch(0, 1)).values(), 0.1
        )
        # float32 sums (carried as float64): to float32's rounding
        torch.testing.assert_close(sums, loss_sums(model, *seed_batch(0, 1).values(), 0.1), rtol=1e-5, atol=1e-5)
    assert len(backend) == 2  # one graph each, no break


def test_a_run_over_many_lengths_compiles_a_bounded_number_of_times(backend):
    # Sources of 1 to 40 tokens in batches of 4: about 40 distinct lengths a side, rounded up to 6 a side.
    cfg = build_config({
        "preset": "transformer", "seed": 0,
        "task": {"name": "reverse", "min_len": 1, "max_len": 40, "vocab_size": 8, "n_train": 200},
        "model": {"d_model": 16, "layers": 1, "heads": 2, "d_ff": 32, "dropout": 0.0, "max_positions": 128},
        "train": {"batch_size": 4, "compile": True},
    })  # fmt: skip
    data = build_task(cfg.task, cfg.seed)
    dm = data_module(cfg, data)
    assert dm.bounded_lengths
    torch.manual_seed(0)
    model = build_model(cfg.model, len(data.src_vocab), len(data.tgt_vocab), PAD_ID)
    steps = Steps(True, cfg.model)
    lengths, raw = set(), set()
    for i, batch in enumerate(dm.train_dataloader()):
        if i == 40:
            break
        raw.add(int((batch["src"] != PAD_ID).sum(1).max()))
        lengths.add((batch["src"].size(1), batch["tgt_in"].size(1)))
        steps.run(training_loss, model, batch, 0.0).backward()
    assert len(raw) > 15
    src_cap, tgt_cap = dm.caps["train"]
    assert all(s % LENGTH_MULTIPLE == 0 or s == src_cap for s, _ in lengths)
    assert all(t % LENGTH_MULTIPLE == 0 or t == tgt_cap for _, t in lengths)
    assert len({s for s, _ in lengths}) <= -(-src_cap // LENGTH_MULTIPLE)  # the shapes a CUDA graph records
    # The bound: one static graph, then one each time another of the batch's sizes (source length, target
    # length, rows) is first seen to change, which dynamo's automatic dynamic shapes make symbolic from then on.
    assert len(backend) <= 4


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_a_process_that_trains_many_configurations_never_reaches_the_recompile_limit(backend):
    # A worker runs trial after trial: one function compiled for all of them would reach dynamo's recompile
    # limit (8 graphs a code object), where fullgraph fails. Each configuration compiles its own copy.
    batch = seed_batch(0, 0)
    for heads in (1, 2, 4, 8):
        for pos in ("sinusoidal", "none", "learned"):
            cfg = ModelConfig(arch="transformer", d_model=16, layers=1, heads=heads, d_ff=32, dropout=0.0,
                              pos_encoding=pos, max_positions=16)  # fmt: skip
            for _ in range(2):  # a second trial of the configuration reuses its graphs
                model = build_model(cfg, VOCAB, VOCAB, PAD_ID)
                Steps(True, cfg).run(training_loss, model, batch, 0.0).backward()
    assert torch._dynamo.config.recompile_limit < len(backend) <= 2 * 12  # 12 configurations, none failed


def tiny(seed: int = 3, **train):
    return build_config({
        "preset": "transformer", "seed": seed,
        "task": {"name": "reverse", "min_len": 3, "max_len": 11, "test_max_len": 13, "vocab_size": 10,
                 "n_train": 256, "n_valid": 32, "n_test": 32},
        "model": {"d_model": 16, "layers": 1, "heads": 2, "d_ff": 32, "dropout": 0.0},
        "train": {"batch_size": 32, "lr": 0.01, "max_steps": 12, "val_every": 4, **train},
    })  # fmt: skip


def assert_close_trials(a, b, tol):
    assert a.steps == b.steps and a.best_step == b.best_step
    for name, value in b.metrics.items():
        assert a.metrics[name] == pytest.approx(value, rel=tol, abs=tol), name


def test_a_compiled_trial_gets_the_numbers_of_an_eager_one(backend):
    eager = run_trial(tiny(compile=False))
    compiled = run_trial(tiny(compile=True))
    assert backend, "nothing was compiled"
    assert_close_trials(compiled, eager, 1e-5)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fused", [False, True], ids=["alone", "fused"])
def test_a_captured_trial_on_cuda_gets_the_numbers_of_an_eager_one(fused, monkeypatch):
    # Inductor's code, captured as CUDA graphs (mode reduce-overhead): what train.compile auto runs on a GPU.
    torch.compiler.reset()
    monkeypatch.setattr(steps_module, "_COMPILED", {})
    eager = [run_trial(tiny(seed, compile=False)) for seed in (3, 4)]
    if fused:
        compiled = run_fused([Member(tiny(seed, compile="auto", fuse_seeds=True)) for seed in (3, 4)])
    else:
        compiled = [run_trial(tiny(seed, compile="auto")) for seed in (3, 4)]
    for c, e in zip(compiled, eager):
        assert_close_trials(c, e, 1e-4)
    torch.compiler.reset()


def test_a_fused_group_compiles_and_trains_under_bf16_autocast_as_its_seeds_alone(backend):
    alone = [run_trial(tiny(seed, precision="bf16-mixed")) for seed in (3, 4)]
    fused = run_fused([Member(tiny(seed, precision="bf16-mixed", compile=True)) for seed in (3, 4)])
    assert backend, "nothing was compiled"
    for f, a in zip(fused, alone):
        # bf16 rounding differs between one stacked matmul and two: close, not equal
        assert_close_trials(f, a, 0.02)


@pytest.mark.slow  # Inductor's code generation: about a minute on 2 cores
def test_inductor_compiled_steps_equal_eager_ones():
    torch.compiler.reset()
    models = plain_models(no_dropout(CASES[3].values[0]), 1)
    model, twin = models[0], copy.deepcopy(models[0])
    compiled = torch.compile(training_loss, fullgraph=True)
    for seed in SEEDS[:3]:
        batch = seed_batch(seed % 2, seed)
        loss, grads = loss_and_grads(compiled, model, padded_batch(batch), 0.1)
        eager_loss, eager_grads = loss_and_grads(training_loss, twin, batch, 0.1)
        torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
        for g, e in zip(grads, eager_grads, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
    torch.compiler.reset()
