"""Every train.* and model.* key reaches the object that uses it.

One case per config key: the key is changed from a base config and its effect is observed on what the
harness builds from the config (the loss of a training step, the learning rate the scheduler installs,
the Trainer's settings, the search decoding calls, the model's structure or output). The key list comes
from the config schema itself, so a key added without a case here fails `test_key_reaches_its_user`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Timer
from torch import nn

from ablate.harness.callbacks import EarlyStop
from ablate.harness.grouping import wants_fusion
from ablate.harness.tasks import build_task
from ablate.harness.tasks.datamodule import Seq2SeqDataModule
from ablate.harness.trial import build_module, build_trainer, data_module, run_trial
from ablate.models.sequences import PAD_ID
from ablate.schema.config import ExperimentConfig, build_config
from tests.conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN

pytestmark = pytest.mark.usefixtures("single_thread")

# A fixed batch for model outputs: two sources, one padded (ids below the tiny task's vocabulary).
SRC = torch.tensor([[4, 5, 6, 7, 2], [5, 6, 2, 0, 0]])
TGT_IN = torch.tensor([[1, 7, 6, 5, 4], [1, 6, 5, 0, 0]])


@dataclasses.dataclass
class Built:
    cfg: ExperimentConfig
    datamodule: Seq2SeqDataModule
    module: Any
    trainer: L.Trainer


def build(root, overrides: dict[str, Any]) -> Built:
    """What a trial builds from a config, through the harness's own entry points (harness/trial.py);
    the only place that knows how to call them."""
    tree = {"task": dict(TINY_TASK), "model": dict(TINY_MODEL), "train": dict(TINY_TRAIN)}
    cfg = build_config(tree, overrides)
    L.seed_everything(cfg.seed, verbose=False)
    data = build_task(cfg.task, cfg.seed)
    dm = data_module(cfg, data)
    torch.manual_seed(0)  # equal seeds: two builds differ only by what the changed key does
    module = build_module(cfg, data, dm.eval_splits)
    trainer = build_trainer(cfg, [], [], False, str(root))
    return Built(cfg, dm, module, trainer)


@dataclasses.dataclass
class Case:
    value: Any  # the changed value
    check: Callable[[Built, Built], None]  # (base, changed) -> asserts the effect
    # Overrides that make the key matter, or that its check needs.
    base: dict[str, Any] = dataclasses.field(default_factory=dict)


# Observations.


def optimizer_and_lambda(built: Built):
    opt = built.module.configure_optimizers()
    return opt["optimizer"], opt["lr_scheduler"]["scheduler"].lr_lambdas[0]


def lr_at(built: Built, step: int) -> float:
    optimizer, factor = optimizer_and_lambda(built)
    return optimizer.defaults["lr"] * factor(step)


def logits(built: Built, train: bool = False) -> torch.Tensor:
    model = built.module.model.train(train)
    with torch.no_grad():
        return model(SRC, TGT_IN)


def outputs_differ(base: Built, changed: Built) -> None:
    a, b = logits(base), logits(changed)
    assert a.shape != b.shape or not torch.allclose(a, b)


def first_step_loss(built: Built) -> tuple[float, float]:
    """train/loss of one fitted step, and the label-smoothed cross entropy of that step's batch written
    out by hand: (1 - eps) (-log p_gold) + eps mean_v(-log p_v), averaged over non-padding targets."""
    eps, seen = built.cfg.train.label_smoothing, {}

    class Expect(L.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            with torch.no_grad():
                logp = module.model(batch["src"], batch["tgt_in"]).log_softmax(-1)
            gold = batch["tgt_out"]
            per_token = -(1 - eps) * logp.gather(-1, gold[..., None])[..., 0] - eps * logp.mean(-1)
            seen["loss"] = float(per_token[gold != PAD_ID].mean())

    built.trainer.callbacks.append(Expect())
    built.trainer.fit(built.module, datamodule=built.datamodule)
    return float(built.trainer.callback_metrics["train/loss"]), seen["loss"]


def search_calls(built: Built, monkeypatch) -> list[tuple[int, float]]:
    """(beam size, length penalty) of every beam search a test step runs."""
    import ablate.models.module as module_code

    calls = []
    real = module_code.beam_search

    def spy(model, src, bos, eos, pad, beam_size, alpha, max_len):
        calls.append((beam_size, alpha))
        return real(model, src, bos, eos, pad, beam_size, alpha, max_len)

    monkeypatch.setattr(module_code, "beam_search", spy)
    batch = next(iter(built.datamodule.test_dataloader()[0]))
    built.module.test_step(batch, 0)
    return calls


def dropout_rates(built: Built) -> set[float]:
    return {m.p for m in built.module.model.modules() if isinstance(m, nn.Dropout)}


# The cases. Each asserts the changed value's own effect, not only "something changed".


def check_label_smoothing(base, changed):
    base_loss, base_expected = first_step_loss(base)
    loss, expected = first_step_loss(changed)
    assert base_loss == pytest.approx(base_expected, abs=1e-5)
    assert loss == pytest.approx(expected, abs=1e-5)
    assert abs(loss - base_loss) > 1e-3


def check_search(monkeypatch):
    def check(base, changed):
        assert search_calls(changed, monkeypatch) == [
            (changed.cfg.train.beam_size, changed.cfg.train.length_penalty)
        ]

    return check


def trainer_attribute(name: str, expected_changed: Any, expected_base: Any):
    def check(base, changed):
        assert getattr(base.trainer, name) == expected_base
        assert getattr(changed.trainer, name) == expected_changed

    return check


def check_batch_size(base, changed):
    assert next(iter(base.datamodule.train_dataloader()))["src"].size(0) == 16
    assert next(iter(changed.datamodule.train_dataloader()))["src"].size(0) == 8


def check_batch_tokens(base, changed):
    batches = list(changed.datamodule.train_dataloader())
    assert all(b["src"].numel() <= 24 and b["tgt_in"].numel() <= 24 for b in batches)
    assert len(batches) > len(base.datamodule.train_dataloader())


def check_lr(base, changed):
    assert lr_at(base, 0) == pytest.approx(1e-3) and lr_at(changed, 0) == pytest.approx(0.02)


def check_weight_decay(base, changed):
    assert optimizer_and_lambda(changed)[0].param_groups[0]["weight_decay"] == 0.25
    assert optimizer_and_lambda(base)[0].param_groups[0]["weight_decay"] == 0.01


def check_schedule(base, changed):
    # inverse_sqrt without warmup: lr * min(s + 1, 1 / sqrt(s + 1)); at step 3 half the base lr.
    assert lr_at(base, 3) == pytest.approx(1e-3) and lr_at(changed, 3) == pytest.approx(0.5e-3)


def check_warmup(base, changed):
    assert lr_at(base, 0) == pytest.approx(1e-3) and lr_at(changed, 0) == pytest.approx(1e-3 / 4)


def check_max_steps(base, changed):
    assert base.trainer.max_steps == 4 and changed.trainer.max_steps == 10
    # The cosine schedule ends at max_steps: zero there, not before.
    assert lr_at(changed, 10) == pytest.approx(0) and lr_at(base, 4) == pytest.approx(0)
    assert lr_at(changed, 4) > 1e-4


def check_max_epochs(base, changed):
    assert base.trainer.max_epochs == -1 and changed.trainer.max_epochs == 3
    assert changed.trainer.check_val_every_n_epoch == 1


def check_max_time(base, changed):
    assert not [c for c in base.trainer.callbacks if isinstance(c, Timer)]
    (timer,) = [c for c in changed.trainer.callbacks if isinstance(c, Timer)]
    assert timer._duration == 30


def check_patience(base, changed):
    assert not [c for c in base.trainer.callbacks if isinstance(c, EarlyStop)]
    (stop,) = [c for c in changed.trainer.callbacks if isinstance(c, EarlyStop)]
    assert stop.rule.patience == 3


def check_deterministic(base, changed):
    # Trainer(deterministic=...) sets torch's global flag; build order decides what it is now.
    try:
        build_trainer(changed.cfg, [], [], False, "/tmp")
        assert torch.are_deterministic_algorithms_enabled()
        build_trainer(base.cfg, [], [], False, "/tmp")
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def check_compile(base, changed):
    cpu = torch.device("cpu")  # auto compiles on CUDA alone
    assert not base.module.steps.compiling(cpu) and not base.datamodule.bounded_lengths
    assert changed.module.steps.compiling(cpu) and changed.datamodule.bounded_lengths


def check_val_every(base, changed):
    assert base.trainer.val_check_interval == 2 and changed.trainer.val_check_interval == 3
    assert changed.trainer.log_every_n_steps == 3


def checkpoints_of(built: Built, root) -> tuple[list[int], bool]:
    """Runs the config as a trial: the steps of the resume checkpoints it hands on, and whether one is
    left in its folder at the end."""
    steps: list[int] = []
    run_trial(built.cfg, out_dir=root, publish=lambda folder, step: steps.append(step))
    return steps, (root / "checkpoints" / "resume.ckpt").exists()


def check_checkpoint_every(base, changed, tmp_path):
    # TINY_TRAIN runs 4 steps: every 2 steps gives the one at step 2 (the last step needs none).
    assert checkpoints_of(base, tmp_path / "base") == ([], False)
    assert checkpoints_of(changed, tmp_path / "changed") == ([2], False)


def check_keep_checkpoints(base, changed, tmp_path):
    assert checkpoints_of(base, tmp_path / "base") == ([2], False)
    assert checkpoints_of(changed, tmp_path / "changed") == ([2], True)


def check_fuse_seeds(base, changed):
    assert not wants_fusion(base.cfg, cuda=False) and wants_fusion(base.cfg, cuda=True)
    assert wants_fusion(changed.cfg, cuda=False) and wants_fusion(changed.cfg, cuda=True)


def check_arch(base, changed):
    assert type(base.module.model).__name__ == "Transformer"
    assert type(changed.module.model).__name__ == "RNNSeq2Seq"


def check_dropout(base, changed):
    assert dropout_rates(base) == {0.0} and dropout_rates(changed) == {0.3}
    assert torch.equal(logits(base, train=True), logits(base, train=True))
    assert not torch.equal(logits(changed, train=True), logits(changed, train=True))


def check_tie_embeddings(base, changed):
    model, base_model = changed.module.model, base.module.model
    assert model.generator.weight is model.tgt_embed.weight
    assert base_model.generator.weight is not base_model.tgt_embed.weight


def check_max_positions(base, changed):
    logits(base)  # 512 learned positions cover the batch
    with pytest.raises(ValueError, match="model.max_positions"):
        logits(changed)


def check_pos_init(base, changed):
    # Learned rows start at std 0.02 by default; `embedding`, at the std of the token embeddings of both
    # sides (one vocabulary; row 0 padding) times sqrt(d): xavier's sqrt(2 / (V + d)) sqrt(d), about 1.2.
    table = lambda built: built.module.model.positions.embedding.embedding.weight  # noqa: E731
    model = changed.module.model
    tokens = torch.cat([model.src_embed.weight[1:], model.tgt_embed.weight[1:]]) * model.embed_scale
    assert abs(table(base).std().item() / 0.02 - 1) < 0.05
    assert abs(table(changed).std().item() / tokens.std().item() - 1) < 0.05
    outputs_differ(base, changed)


def weight_heads(kind: str, heads: int):
    """The changed model attends with `heads` heads (its `kind` weights) and computes something else."""

    def check(base, changed):
        outputs_differ(base, changed)
        with torch.no_grad():
            weights = changed.module.model.eval()(SRC, TGT_IN, need_weights=True)[1][kind][0]
        assert weights.size(1) == heads

    return check


def model_has(part: Callable[[nn.Module], bool]):
    """The changed model has `part` and the base model has not, and their outputs differ."""

    def check(base, changed):
        outputs_differ(base, changed)
        assert part(changed.module.model) and not part(base.module.model)

    return check


def check_attention_width(base, changed):
    # D = 10 takes in every position of these sources; D = 1 only ⌊p_t⌋ ± 1 (local-m: p_t = t at step 0).
    for built, attended in ((base, 5), (changed, 2)):
        with torch.no_grad():
            (cross,) = built.module.model.eval()(SRC, TGT_IN, need_weights=True)[1]["cross"]
        assert int((cross[0, 0, 0] > 0).sum()) == attended
    outputs_differ(base, changed)


def reads_target(at: int, changed: int, base_reads: bool):
    """Whether the output at target position `at` depends on the target token at `changed`: as
    `base_reads` says for the base model, the other way for the changed one."""

    def check(base, changed_model):
        other = TGT_IN.clone()
        other[:, changed] = 8
        for built, depends in ((base, base_reads), (changed_model, not base_reads)):
            model = built.module.model.eval()
            with torch.no_grad():
                first, second = model(SRC, TGT_IN)[:, at], model(SRC, other)[:, at]
            assert (not torch.allclose(first, second)) == depends

    return check


def check_cross_attention(base, changed):
    # Without cross-attention the source cannot change the output.
    other = SRC.flip(0)
    for built, sees in ((base, True), (changed, False)):
        model = built.module.model.eval()
        with torch.no_grad():
            a, b = model(SRC, TGT_IN), model(other, TGT_IN)
        assert (not torch.allclose(a, b)) == sees


def t5_bias_has(test):
    """The changed model's decoder T5 bias passes `test`, and the model computes something else."""
    return model_has(lambda m: test(m.positions.score_bias["tgt"]))


LSTM = {"model.arch": "lstm", "model.attention": "additive", "model.attention_query": "previous"}
CLASSIFIER = {"model.arch": "classifier", "task.name": "cues", "model.attention": "additive"}
CAPTIONER = {"model.arch": "captioner", "task.name": "digits", "model.attention": "additive", "task.max_len": 2}


def check_doubly_stochastic(base, changed):
    # The penalty joins the training loss alone: the first step's loss is the cross entropy without it, and
    # more than that with it, from the same weights and batch.
    loss, cross_entropy = first_step_loss(base)
    assert loss == pytest.approx(cross_entropy, abs=1e-5)
    loss, cross_entropy = first_step_loss(changed)
    assert loss > cross_entropy + 1e-3


def cases(monkeypatch, tmp_path=None) -> dict[str, Case]:
    return {
        "train.batch_size": Case(8, check_batch_size),
        "train.batch_tokens": Case(24, check_batch_tokens),
        "train.lr": Case(0.02, check_lr),
        "train.weight_decay": Case(0.25, check_weight_decay),
        "train.schedule": Case("inverse_sqrt", check_schedule),
        "train.warmup_steps": Case(4, check_warmup),
        "train.max_steps": Case(10, check_max_steps, {"train.schedule": "cosine"}),
        "train.max_epochs": Case(3, check_max_epochs),
        "train.max_time": Case(30.0, check_max_time),
        # fp32, said outright: the expected loss is written out by hand outside autocast.
        "train.label_smoothing": Case(
            0.2, check_label_smoothing, {"train.max_steps": 1, "train.precision": "32-true"}
        ),
        "train.grad_clip": Case(0.5, trainer_attribute("gradient_clip_val", 0.5, 1.0)),
        # The base's `auto` is fp32 on every device.
        "train.precision": Case("64-true", trainer_attribute("precision", "64-true", "32-true")),
        "train.beam_size": Case(3, check_search(monkeypatch)),
        "train.length_penalty": Case(1.5, check_search(monkeypatch), {"train.beam_size": 2}),
        "train.patience": Case(3, check_patience),
        "train.deterministic": Case(True, check_deterministic),
        "train.compile": Case(True, check_compile),
        "train.val_every": Case(3, check_val_every),
        "train.checkpoint_every": Case(2, lambda b, c: check_checkpoint_every(b, c, tmp_path)),
        "train.keep_checkpoints": Case(
            True, lambda b, c: check_keep_checkpoints(b, c, tmp_path), {"train.checkpoint_every": 2}
        ),
        # Read where a worker decides whether a variant's seeds train fused; `auto` fuses on a GPU only.
        "train.fuse_seeds": Case(True, check_fuse_seeds),
        "model.arch": Case("lstm", check_arch),
        "model.d_model": Case(8, model_has(lambda m: m.tgt_embed.weight.size(1) == 8)),
        "model.layers": Case(2, model_has(lambda m: len(m.decoder) == 2)),
        "model.dropout": Case(0.3, check_dropout),
        "model.tie_embeddings": Case(True, check_tie_embeddings),
        "model.cell": Case("gru", model_has(lambda m: m.decoder.cell == m.encoder.rnn.cell == "gru"), LSTM),
        "model.bidirectional": Case(False, model_has(lambda m: not m.encoder.rnn.bidirectional), LSTM),
        "model.attention": Case(
            "dot", model_has(lambda m: type(m.attention.score).__name__ == "DotScore"), LSTM
        ),
        # previous: the context joins the decoder's input; current: it does not.
        "model.attention_query": Case("current", model_has(lambda m: m.decoder.input_size == 16), LSTM),
        "model.input_feeding": Case(True, model_has(lambda m: m.decoder.input_size == 48), LSTM),
        "model.attention_heads": Case(2, weight_heads("cross", 2), LSTM),
        "model.attention_window": Case(
            "local-p", model_has(lambda m: type(m.attention.window).__name__ == "PredictiveWindow"), LSTM
        ),
        "model.attention_width": Case(
            1, check_attention_width, {**LSTM, "model.attention_window": "local-m"}
        ),
        "model.heads": Case(4, weight_heads("decoder", 4)),
        "model.key_dim": Case(
            2, model_has(lambda m: m.decoder[0].self_attn.fn.attn.q_proj.weight.shape[0] == 2 * m.cfg.heads)
        ),
        "model.d_ff": Case(8, model_has(lambda m: m.decoder[0].ff.fn.net[0].out_features == 8)),
        "model.ffn": Case(False, model_has(lambda m: not any(isinstance(x, nn.ReLU) for x in m.modules()))),
        "model.scale": Case(0.05, outputs_differ),
        "model.score": Case(
            "cosine", model_has(lambda m: type(m.decoder[0].cross_attn.fn.attn.score).__name__ == "QKNorm")
        ),
        "model.pos_encoding": Case("rope", outputs_differ),
        "model.pos_base": Case(100.0, outputs_differ),
        "model.pos_init": Case("embedding", check_pos_init, {"model.pos_encoding": "learned"}),
        "model.max_positions": Case(4, check_max_positions, {"model.pos_encoding": "learned"}),
        "model.residual": Case(False, outputs_differ),
        "model.norm": Case("pre", outputs_differ),
        "model.causal_mask": Case(False, reads_target(0, 2, False)),  # only unmasked: a later token
        "model.cross_attention": Case(False, check_cross_attention),
        "model.decoder_self_attention": Case(False, reads_target(2, 1, True)),  # only with it: an earlier one
        "model.t5_buckets": Case(8, t5_bias_has(lambda bias: bias.weight.shape[0] == 8), {"model.pos_encoding": "t5"}),
        # Four buckets, two exact: the distances of the test batch reach the logarithmic ones.
        "model.t5_max_distance": Case(
            3, t5_bias_has(lambda bias: bias.max_distance == 3), {"model.pos_encoding": "t5", "model.t5_buckets": 4}
        ),
        "model.embed_scale": Case(False, outputs_differ),
        "model.qkv_projections": Case(False, outputs_differ),
        "model.encoder": Case(
            "transformer", model_has(lambda m: type(m.body).__name__ == "Transformer"), CLASSIFIER
        ),
        "model.pooling": Case("attention", model_has(lambda m: m.query is not None), CLASSIFIER),
        "model.doubly_stochastic": Case(1.0, check_doubly_stochastic, CAPTIONER),
    }


SCHEMA_KEYS = sorted(k for k in ExperimentConfig().flat() if k.startswith(("train.", "model.")))


@pytest.mark.parametrize("key", SCHEMA_KEYS)
def test_key_reaches_its_user(key, tmp_path, monkeypatch):
    case = cases(monkeypatch, tmp_path).get(key)
    if case is None:
        pytest.fail(f"{key} has no plumbing case: add one to tests/test_plumbing.py")
    base = build(tmp_path / "base", case.base)
    changed = build(tmp_path / "changed", {**case.base, key: case.value})
    assert changed.cfg.flat()[key] == case.value != base.cfg.flat()[key]
    case.check(base, changed)


def test_every_case_names_a_config_key(monkeypatch):
    assert set(cases(monkeypatch)) <= set(SCHEMA_KEYS)
