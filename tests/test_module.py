"""Seq2SeqModule and run_trial: loss, schedules, checkpoints, determinism, budgets, logging, precision."""

import math
from contextlib import contextmanager
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import WandbLogger

from ablate.harness.artifacts import AttentionSample
from ablate.harness.probes import heatmap
from ablate.harness.rules import peak_rss_mb
from ablate.harness.tasks import build_task
from ablate.harness.trial import build_module, resolve_precision, run_trial
from ablate.models.module import Seq2SeqModule, lr_lambda
from ablate.models.optim import OptimConfig
from ablate.models.sequences import EOS_ID
from ablate.models.steps import token_cross_entropy
from ablate.schema.config import load_config

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(*sets: str, preset: str = "transformer"):
    return load_config(None, preset, [
        "task.name=copy", "task.max_len=5", "task.test_max_len=7", "task.n_train=128", "task.n_valid=32",
        "task.n_test=32", "model.d_model=16", "model.layers=1", "model.heads=2", "model.d_ff=32",
        "train.batch_size=32", "train.max_steps=8", "train.val_every=4", *sets,
    ])  # fmt: skip


def test_label_smoothed_loss_equals_its_closed_form():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    target = torch.tensor([[3, 1, 0], [4, 0, 0]])  # three real tokens, three padding
    eps = 0.1
    log_p = logits.log_softmax(-1)
    # (1 - eps) * NLL of the gold token + eps * mean over the vocabulary of -log p, averaged over real tokens.
    per_token = [
        (1 - eps) * -log_p[b, t, target[b, t]] + eps * -log_p[b, t].mean()
        for b, t in [(0, 0), (0, 1), (1, 0)]
    ]
    expected = torch.stack(per_token).mean()
    assert token_cross_entropy(logits, target, eps).item() == pytest.approx(expected.item(), rel=1e-6)
    # Padding positions do not count, whatever the model says there.
    logits[0, 2], logits[1, 1:] = 100.0, -100.0
    assert token_cross_entropy(logits, target, eps).item() == pytest.approx(expected.item(), rel=1e-6)
    assert token_cross_entropy(logits, target).item() == pytest.approx(
        torch.stack([-log_p[0, 0, 3], -log_p[0, 1, 1], -log_p[1, 0, 4]]).mean().item(), rel=1e-6
    )


def test_schedules():
    inverse_sqrt = lr_lambda("inverse_sqrt", warmup_steps=100, max_steps=1000)
    assert inverse_sqrt(49) == pytest.approx(0.5)  # linear warmup
    assert inverse_sqrt(99) == pytest.approx(1.0)
    assert inverse_sqrt(399) == pytest.approx(0.5)  # sqrt(100 / 400)
    cosine = lr_lambda("cosine", warmup_steps=10, max_steps=110)
    assert cosine(4) == pytest.approx(0.5)
    assert cosine(10) == pytest.approx(1.0)
    assert cosine(60) == pytest.approx(0.5)
    assert cosine(110) == pytest.approx(0.0, abs=1e-12)
    assert lr_lambda("constant", 0, 100)(0) == 1.0
    assert lr_lambda("constant", 4, 100)(1) == 0.5


@pytest.mark.parametrize("beam_size", [1, 3])
def test_generation_may_run_past_twice_the_source(beam_size):
    """SCAN maps 9 words to 48 actions: the output budget also follows the longest training target."""
    module = Seq2SeqModule({"d_model": 16, "heads": 2, "d_ff": 32, "layers": 1}, 10, 10, train_max_len=48)
    with torch.no_grad():
        module.model.generator.bias[EOS_ID] = -1e9  # never EOS: the output runs to the budget
    src = torch.tensor([[5] * 9 + [EOS_ID]])
    assert module.generate(src, beam_size).size(1) == 2 * 48 + 10
    assert Seq2SeqModule(module.model_cfg, 10, 10).hparams.train_max_len == 0  # without it: 2 * 10 + 10


def test_training_settings_reach_the_module_whole():
    cfg = tiny("train.lr=0.003", "train.weight_decay=0.2", "train.schedule=cosine", "train.warmup_steps=4",
               "train.label_smoothing=0.1", "train.beam_size=3", "train.length_penalty=1.0")  # fmt: skip
    data = build_task(cfg.task, cfg.seed)
    module = build_module(cfg, data, ["test"])
    assert module.optim == OptimConfig.of(cfg.train)
    assert (module.optim.beam_size, module.optim.length_penalty, module.optim.label_smoothing) == (
        3,
        1.0,
        0.1,
    )
    optimizers = module.configure_optimizers()
    group = optimizers["optimizer"].param_groups[0]
    assert (group["initial_lr"], group["weight_decay"]) == (0.003, 0.2)
    assert group["lr"] == pytest.approx(0.003 / 4)  # cosine's linear warmup, first of 4 steps
    assert module.hparams["optim"] == OptimConfig.of(cfg.train).model_dump()  # what a checkpoint keeps


def test_compile_keeps_checkpoint_names():
    plain = Seq2SeqModule({"d_model": 16, "heads": 2, "d_ff": 32, "layers": 1}, 10, 10)
    compiled = Seq2SeqModule({"d_model": 16, "heads": 2, "d_ff": 32, "layers": 1}, 10, 10, {"compile": True})
    assert compiled.steps.setting is True and compiled.model._compiled_call_impl is None  # the steps compile
    assert list(compiled.state_dict()) == list(plain.state_dict())


class RecordingWandb(WandbLogger):
    """A disabled W&B run that remembers what was sent to it."""

    def __init__(self):
        super().__init__(mode="disabled")
        self.metrics, self.images, self.tables = [], {}, {}

    def log_metrics(self, metrics, step=None):
        self.metrics.append((step, dict(metrics)))
        super().log_metrics(metrics, step)

    def log_image(self, key, images, step=None, **kwargs):
        self.images[key] = (step, images, kwargs)

    def log_table(self, key, columns=None, data=None, dataframe=None, step=None):
        self.tables[key] = (columns, data)


# The reference trial, in float32 on every device, said outright: its checkpoints
# are reloaded and run on the CPU, and other tests compare bf16 runs and reruns against it.
REFERENCE = ("train.deterministic=true", "train.precision=32-true")


@pytest.fixture(scope="module")
def logged_trial(tmp_path_factory):
    out = tmp_path_factory.mktemp("trial")
    logger = RecordingWandb()
    result = run_trial(tiny(*REFERENCE), out_dir=out, loggers=[logger])
    return result, out, logger


def reload(out: Path, name: str) -> Seq2SeqModule:
    """A checkpoint of the reference trial on the CPU, wherever it was trained."""
    return Seq2SeqModule.load_from_checkpoint(
        out / "checkpoints" / f"{name}.ckpt", map_location="cpu", weights_only=True
    )


def test_trial_results_and_artifacts(logged_trial):
    result, out, _ = logged_trial
    for split in ("test", "test_long"):
        # The module's running sums and the per-length table (harness/metrics.py) count the same way.
        rows = [row for row in result.per_length if row["split"] == split]
        n, tokens = sum(r["n"] for r in rows), sum(r["tokens"] for r in rows)
        assert result.metrics[f"{split}/seq_acc"] == pytest.approx(sum(r["seq_acc"] * r["n"] for r in rows) / n)
        assert result.metrics[f"{split}/tok_acc"] == pytest.approx(sum(r["tok_acc"] * r["tokens"] for r in rows) / tokens)
        assert tokens == sum(r["n"] * (r["length"] + 1) for r in rows)  # every target position and its EOS
    for split in ("val", "test", "test_long"):
        # Perplexity of the unsmoothed model: with no label smoothing it is exp(loss).
        assert result.metrics[f"{split}/ppl"] == pytest.approx(
            math.exp(result.metrics[f"{split}/loss"]), rel=1e-4
        )
    assert result.steps == 8 and [row["step"] for row in result.history] == [4, 8]
    # Rank collapse of the last layers (Dong et al. 2021): 0 would be every token the same vector.
    for split in ("test", "test_long"):
        for side in ("encoder", "decoder"):
            assert 0.05 < result.metrics[f"{split}/rank_collapse_{side}"] <= 1
    assert result.tokens_per_sec > 0 and result.peak_mem_mb > 0 and result.params > 0
    lengths = {(row["split"], row["length"]): row["n"] for row in result.per_length}
    assert sum(n for (split, _), n in lengths.items() if split == "test") == result.split_sizes["test"]
    assert {length for split, length in lengths if split == "test_long"} <= {6, 7}
    assert (out / "checkpoints" / "best.ckpt").is_file() and (out / "checkpoints" / "last.ckpt").is_file()
    files = sorted(p.name for p in (out / "attention").iterdir())
    stems = ["probe0_test", "probe1_test", "probe2_test_long"]
    assert files == [f"{stem}{suffix}" for stem in stems for suffix in (".npz", ".png")]  # arrays and heatmap
    sample = AttentionSample.load(out / "attention" / "probe2_test_long.npz")
    assert sample.split == "test_long" and sample.src[-1] == "</s>" and sample.tgt_in[0] == "<s>"
    cross = sample.weights["cross"]  # (layers, heads, tgt_out, src)
    assert cross.shape == (1, 2, len(sample.tgt_out), len(sample.src))
    np.testing.assert_allclose(cross.sum(-1), 1.0, rtol=1e-5)
    assert set(sample.weights) == {"encoder", "decoder", "cross"}
    # Copy aligns target j with source j.
    assert sample.alignment.tolist() == [[j, j] for j in range(len(sample.src) - 1)]


def test_checkpoint_round_trip_restores_identical_outputs(logged_trial):
    result, out, _ = logged_trial
    for name in ("best", "last"):
        module = reload(out, name)
        assert module.num_parameters() == result.params
        assert module.optim == OptimConfig.of(tiny().train)
    # The test metrics and probes come from the best checkpoint, so reloading it reproduces the probes.
    module = reload(out, "best")
    from ablate.harness.probes import capture, select_probes

    cfg = tiny()
    again = capture(module, select_probes(build_task(cfg.task, cfg.seed)))
    for before, after in zip(result.attention, again, strict=True):
        for kind in before.weights:
            # The trial's samples are cut from padded test batches on its device, these run alone on the
            # CPU: equal to rounding.
            np.testing.assert_allclose(before.weights[kind], after.weights[kind], atol=1e-6)
    src = torch.tensor([[4, 5, 6, 2], [7, 2, 0, 0]])
    reloaded = reload(out, "best")
    assert torch.equal(module.generate(src), reloaded.generate(src))
    assert torch.equal(module.generate(src, beam_size=3), reloaded.generate(src, beam_size=3))


def test_same_seed_deterministic_runs_give_identical_metrics(logged_trial):
    result, _, _ = logged_trial
    again = run_trial(tiny(*REFERENCE))  # no out_dir, no logger: must not matter
    assert again.metrics == result.metrics
    assert again.history == result.history
    assert again.per_length == result.per_length
    other_seed = run_trial(tiny(*REFERENCE, "seed=1"))
    assert other_seed.metrics != result.metrics


def test_everything_goes_to_the_logger(logged_trial):
    result, _, logger = logged_trial
    logged = {}
    for step, metrics in logger.metrics:
        for key in metrics:
            logged.setdefault(key, []).append(step)
    # Two validations; Lightning numbers logger steps from 0, so they land on steps 3 and 7.
    assert logged["val/loss"] == logged["val/seq_acc"] == [3, 7]
    last = {key: value for _, metrics in logger.metrics for key, value in metrics.items()}
    assert last["train/lr"] == pytest.approx(1e-3)  # the constant schedule's lr
    assert math.isfinite(last["train/loss"]) and last["train/loss"] > 0
    for key in ("test/seq_acc", "test/tok_acc", "test_long/ppl", "val/loss"):
        assert last[key] == pytest.approx(result.metrics[key]), key
    assert (last["cost/params"], last["cost/wall_time"]) == (result.params, result.wall_time)
    assert (last["cost/tokens_per_sec"], last["cost/peak_mem_mb"]) == (result.tokens_per_sec, result.peak_mem_mb)
    # Heatmaps: per probe and kind, one image per layer, logged at each validation and at the end.
    step, images, kwargs = logger.images["attention/cross/probe2"]
    assert step == 8 and len(images) == 1 and len(kwargs["caption"]) == 1
    assert images[0].ndim == 3 and images[0].shape[2] == 3 and images[0].dtype == np.uint8
    assert {"attention/encoder/probe0", "attention/decoder/probe1"} <= set(logger.images)
    columns, data = logger.tables["per_length"]
    assert columns == ["split", "length", "n", "seq_acc", "tok_acc", "tokens"]
    assert data == [list(row.values()) for row in result.per_length]


def test_per_length_table_weighted_gives_the_split_totals(logged_trial):
    # One definition of exact match and token accuracy: the table weighted by examples and by counted
    # target tokens (through EOS) reproduces the module's test metrics of the same pass.
    result, _, _ = logged_trial
    for split in ("test", "test_long"):
        rows = [row for row in result.per_length if row["split"] == split]
        n, tokens = sum(row["n"] for row in rows), sum(row["tokens"] for row in rows)
        assert n == result.split_sizes[split]
        assert tokens == sum(row["n"] * (row["length"] + 1) for row in rows)  # each target plus its EOS
        assert sum(row["n"] * row["seq_acc"] for row in rows) / n == pytest.approx(
            result.metrics[f"{split}/seq_acc"], abs=1e-6
        )
        assert sum(row["tokens"] * row["tok_acc"] for row in rows) / tokens == pytest.approx(
            result.metrics[f"{split}/tok_acc"], abs=1e-6
        )
    assert 0 <= result.metrics["test/aer"] <= 1  # copy has gold alignments


def test_each_test_split_is_read_once(monkeypatch):
    """AER, rank collapse and the attention samples come from the pass that gives the test loss."""
    from ablate.harness.tasks.datamodule import Seq2SeqDataModule

    batches: dict[int, int] = {}  # batches yielded per test loader (Lightning may call iter() to probe one)

    class Counted:
        def __init__(self, loader, index):
            self.loader, self.index = loader, index

        def __iter__(self):
            for batch in self.loader:
                batches[self.index] = batches.get(self.index, 0) + 1
                yield batch

        def __len__(self):
            return len(self.loader)

    plain = Seq2SeqDataModule.test_dataloader
    loaders = []
    monkeypatch.setattr(
        Seq2SeqDataModule,
        "test_dataloader",
        lambda dm: loaders.extend(plain(dm)) or [Counted(lo, i) for i, lo in enumerate(loaders)],
    )
    result = run_trial(tiny("train.max_steps=2", "train.val_every=2"))
    assert batches == {i: len(lo) for i, lo in enumerate(loaders)} and len(loaders) == 2
    assert {"test/aer", "test/rank_collapse_encoder", "test_long/rank_collapse_decoder"} <= set(
        result.metrics
    )
    assert [sample.split for sample in result.attention] == ["test", "test", "test_long"]


def test_heatmap_draws_each_head_and_the_gold_alignment():
    weights = np.zeros((1, 3, 4, 5), dtype=np.float32)  # (layers, heads, tgt_out, src)
    weights[0, :, np.arange(4), np.arange(4)] = 1.0
    sample = AttentionSample("test", [*"abcd", "</s>"], ["<s>", *"xyz"], [*"xyz", "</s>"], {"cross": weights},
                             np.array([[0, 0], [1, 1]]))  # fmt: skip
    image = heatmap(sample, "cross", 0)
    cell = image.shape[0] // 4
    gap = (image.shape[1] - 3 * 5 * cell) // 2
    assert image.shape == (4 * cell, 3 * 5 * cell + 2 * gap, 3) and image.dtype == np.uint8
    third_head = 2 * (5 * cell + gap)
    centre = lambda row, col, x0=0: image[row * cell + cell // 2, x0 + col * cell + cell // 2].tolist()  # noqa: E731
    corner = lambda row, col, x0=0: image[row * cell, x0 + col * cell].tolist()  # noqa: E731
    assert centre(1, 1) == centre(1, 1, third_head) == [255, 0, 0]  # gold links, on every head
    assert centre(2, 2) != [255, 0, 0]  # not a gold link
    assert corner(2, 2) == corner(0, 0, third_head) and corner(2, 2)[0] > 200  # weight 1: yellow
    assert corner(2, 3)[1] < 50  # weight 0: dark


def test_budgets_and_early_stopping():
    # max_epochs: 128 examples in batches of 32 is 4 steps an epoch.
    assert run_trial(tiny("train.max_epochs=1", "train.max_steps=100")).steps == 4
    # An lr too small to move any fp32 weight leaves val/loss flat: patience 2 stops after 3 validations.
    # (On a text task, which also adds BLEU and chrF to the metrics.)
    stopped = run_trial(tiny("train.lr=1e-12", "train.patience=2", "train.max_steps=100", "model.dropout=0",
                             "task.name=synth_mt", "task.min_len=5", "task.max_len=6"))  # fmt: skip
    assert stopped.steps == 12 and len(stopped.history) == 3
    for split in ("test", "test_long"):
        assert 0 <= stopped.metrics[f"{split}/bleu"] <= 100 and 0 <= stopped.metrics[f"{split}/chrf"] <= 100


def test_precision_auto_is_fp32_on_every_device():
    # One precision for every variant of a study, whatever its width or device.
    assert resolve_precision("auto") == "32-true"
    assert resolve_precision("bf16-mixed") == "bf16-mixed"


def test_bf16_mixed_trains_and_beam_searches_on_cpu(logged_trial):
    # CPU autocast runs the same bf16 code paths as CUDA (loss and log-probs are kept in float32);
    # the losses stay close to those of the fp32 run of the same configuration.
    fp32, _, _ = logged_trial
    bf16 = run_trial(tiny("train.deterministic=true", "train.precision=bf16-mixed", "train.beam_size=2"),
                     progress=True)  # fmt: skip
    assert all(math.isfinite(v) for v in bf16.metrics.values())
    for key in ("val/loss", "test/loss", "test_long/loss"):
        assert bf16.metrics[key] == pytest.approx(fp32.metrics[key], rel=0.02)


class TrainBars(L.Callback):
    """What the training bars say at the end of training: description, done, total (Rich keeps every task
    it showed)."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        tasks = trainer.progress_bar_callback.progress.tasks
        self.seen = [
            (t.description.strip(), t.completed, t.total) for t in tasks if "Validation" not in t.description
        ]


def test_progress_bar_counts_the_steps_of_the_budget_across_epochs():
    # The tiny task has 4 batches an epoch: a budget of 6 steps runs through epochs 0 and 1 on one bar of 6
    # steps, where Lightning's counts each epoch's 4 batches under "Epoch 1/-2".
    bar = TrainBars()
    run_trial(tiny("train.max_steps=6", "train.val_every=3"), callbacks=[bar], progress=True)
    assert bar.seen == [("steps", 6, 6)]
    # An epoch budget keeps Lightning's bar: the last epoch's batches, "Epoch 1/1" of two.
    bar = TrainBars()
    run_trial(tiny("train.max_epochs=2"), callbacks=[bar], progress=True)
    assert bar.seen == [("Epoch 1/1", 4, 4)]


def test_validation_runs_every_val_every_steps_across_epochs_shorter_than_that():
    # 4 batches an epoch, validation every 6 steps: at steps 6 and 12 (the end of the budget), not capped to
    # every epoch (4, 8, 12).
    result = run_trial(tiny("train.max_steps=12", "train.val_every=6"))
    assert [row["step"] for row in result.history] == [6, 12]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_cpu_peak_memory_is_each_trials_own():
    # A long-lived worker runs many trials; each reports its own peak RSS, not the largest so far.
    ballast = np.ones(2**26)  # 512 MiB, every page touched
    high = peak_rss_mb()
    del ballast
    result = run_trial(tiny("train.max_steps=2"))
    assert 0 < result.peak_mem_mb < high - 400


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_mixed_on_cuda():
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this CUDA device has no bf16 support")
    result = run_trial(tiny("train.beam_size=2", "train.precision=bf16-mixed"))
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert result.peak_mem_mb > 0


@pytest.mark.slow
def test_learns_to_reverse_and_beam_search_keeps_it():
    cfg = load_config(None, "transformer", [
        "task.name=reverse", "task.max_len=6", "task.n_train=2000", "model.d_model=32", "model.d_ff=64",
        "model.layers=2", "model.dropout=0", "train.max_steps=800", "train.val_every=200", "train.lr=3e-3",
        "train.schedule=inverse_sqrt", "train.warmup_steps=100", "train.label_smoothing=0.1", "train.beam_size=4",
    ])  # fmt: skip
    result = run_trial(cfg)
    assert result.metrics["test/seq_acc"] > 0.9
    # The per-length table of test_long starts just beyond the training lengths.
    long_rows = [row for row in result.per_length if row["split"] == "test_long"]
    assert long_rows and min(row["length"] for row in long_rows) == 7


def test_schedules_at_their_edges():
    # No warmup: every schedule starts at the full lr.
    assert [lr_lambda("constant", 0, 100)(s) for s in (0, 500)] == [1.0, 1.0]
    inverse_sqrt = lr_lambda("inverse_sqrt", warmup_steps=0, max_steps=100)
    assert (inverse_sqrt(0), inverse_sqrt(3)) == (1.0, pytest.approx(0.5))  # sqrt(1 / 4)
    cosine = lr_lambda("cosine", warmup_steps=0, max_steps=100)
    assert cosine(0) == 1.0
    assert cosine(25) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert cosine(50) == pytest.approx(0.5)
    # Warmup reaches 1 and stays there; cosine stays at 0 past max_steps instead of rising again.
    assert [lr_lambda("constant", 4, 100)(s) for s in (3, 10)] == [1.0, 1.0]
    assert lr_lambda("cosine", 10, 110)(210) == pytest.approx(0.0, abs=1e-12)
    # max_steps == warmup_steps: the decay has no length, so the step after warmup is at 0.
    assert lr_lambda("cosine", 10, 10)(10) == 1.0
    assert lr_lambda("cosine", 10, 10)(11) == pytest.approx(0.0, abs=1e-12)


PAD, BOS, EOS, A, B, C = range(6)


class FixedModel(torch.nn.Module):
    """Teacher forcing gives the gold token probability 1/2 and each other token 1/10 (logits log 5 and 0);
    greedy decoding always says A B EOS."""

    gold: torch.Tensor  # (B, T) the batch's tgt_out

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg  # every family keeps its config (models/kinds.py Family)
        self.unused = torch.nn.Parameter(torch.zeros(1))  # something for the optimiser to hold

    def forward(self, src, tgt_in, need_weights=False):
        logits = F.one_hot(self.gold, 6).float() * math.log(5.0) + 0.0 * self.unused  # something to train
        return (logits, {}) if need_weights else logits

    @contextmanager
    def record_states(self):
        yield {}

    def init_state(self, src):
        return {}

    def step(self, state, prev):
        after = {BOS: A, A: B}  # then EOS; logits 10 for the next token leave others no chance in a beam
        next_token = torch.tensor([after.get(int(p), EOS) for p in prev], device=prev.device)
        return F.one_hot(next_token, 6).float() * 10.0, state


# The loss of FixedModel's teacher forcing at each real target token: NLL log 2, and with smoothing 0.1 the
# mean over the vocabulary of -log p is (log 2 + 5 log 10) / 6.
NLL = math.log(2.0)
SMOOTHED = 0.9 * NLL + 0.1 * (math.log(2.0) + 5 * math.log(10.0)) / 6


def fixed_module(**optim) -> tuple[Seq2SeqModule, dict, set]:
    """A module around FixedModel whose `log` records values and which names go to the progress bar."""
    module = Seq2SeqModule({"d_model": 16, "heads": 2, "d_ff": 32, "layers": 1}, 6, 6, optim)
    module.model = FixedModel(module.model.cfg)
    logged, progress_bar = {}, set()

    def log(name, value, prog_bar=False, **kw):
        logged[name] = float(value)
        if prog_bar:
            progress_bar.add(name)

    module.log = log
    return module, logged, progress_bar


def test_training_step_logs_the_smoothed_loss_and_the_lr():
    module, logged, progress_bar = fixed_module(label_smoothing=0.1, lr=0.002)
    module.lr_schedulers = lambda: module.configure_optimizers()["lr_scheduler"]["scheduler"]
    tgt_out = torch.tensor([[A, B, EOS, PAD], [A, C, EOS, PAD]])
    module.model.gold = tgt_out
    loss = module.training_step({"src": torch.full((2, 2), A), "tgt_in": tgt_out, "tgt_out": tgt_out}, 0)
    assert loss.item() == pytest.approx(SMOOTHED, rel=1e-6)
    assert logged == {"train/loss": pytest.approx(SMOOTHED, rel=1e-6), "train/lr": pytest.approx(0.002)}
    assert progress_bar == {"train/loss"}


CUDA = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_evaluation_sums_and_metrics_by_hand(device):
    module, logged, progress_bar = fixed_module(label_smoothing=0.1, beam_size=3)
    module.to(device)
    beam_sizes = []
    generate = module.generate
    module.generate = lambda src, beam_size: beam_sizes.append(beam_size) or generate(src, beam_size)
    tgt_out = torch.tensor([[A, B, EOS, PAD], [A, C, EOS, PAD], [A, B, C, EOS]], device=device)
    src = torch.full((3, 2), A, device=device)  # the sums' counts must live where the loss does
    # Two batches of one split add up: rows 0-1, then row 2.
    for index, rows in enumerate([slice(0, 2), slice(2, 3)]):
        module.model.gold = tgt_out[rows]
        module.validation_step({"src": src[rows], "tgt_in": tgt_out[rows], "tgt_out": tgt_out[rows]}, index)
    module.on_validation_epoch_end()
    # Prediction A B EOS against: A B EOS (exact, 3 of 3), A C EOS (2 of 3), A B C EOS (2 of 4).
    assert logged == {
        "val/loss": pytest.approx(SMOOTHED, rel=1e-6),
        "val/ppl": pytest.approx(2.0, rel=1e-6),  # exp of the unsmoothed NLL
        "val/seq_acc": pytest.approx(1 / 3),
        "val/tok_acc": pytest.approx(7 / 10),
    }
    assert progress_bar == {"val/loss"}
    assert beam_sizes == [1, 1]  # validation decodes greedily whatever train.beam_size says
    assert module._sums == {}  # the next epoch starts from zero


def test_test_step_decodes_with_beam_size_into_its_splits_sums():
    module, _, _ = fixed_module(beam_size=3)
    beam_sizes = []
    generate = module.generate
    module.generate = lambda src, beam_size: beam_sizes.append(beam_size) or generate(src, beam_size)
    tgt_out = torch.tensor([[A, B, EOS], [A, C, EOS]])
    module.model.gold = tgt_out
    batch = {"src": torch.full((2, 2), A), "tgt_in": tgt_out, "tgt_out": tgt_out}
    # One test split: Lightning passes no dataloader_idx.
    assert module.test_step(batch, 0)["pred"].tolist() == [[A, B, EOS]] * 2
    assert beam_sizes == [3]
    assert list(module._sums) == ["test"]
    assert module._sums["test"][2:].tolist() == [6, 1, 5, 2]  # tokens, exact, correct, examples
    module.eval_splits = ["test", "test_long"]
    module.test_step(batch, 0, dataloader_idx=1)
    assert list(module._sums) == ["test", "test_long"]


def test_the_schedule_steps_with_every_optimiser_step():
    module, _, _ = fixed_module(lr=0.004, warmup_steps=4)
    lrs = []
    module.log = lambda name, value, **kw: lrs.append(float(value)) if name == "train/lr" else None
    tgt_out = torch.tensor([[A, B, EOS]])
    module.model.gold = tgt_out
    batch = {"src": torch.full((1, 2), A), "tgt_in": tgt_out, "tgt_out": tgt_out}
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")  # fmt: skip
    trainer.fit(module, torch.utils.data.DataLoader([batch] * 3, batch_size=None))  # one epoch of three steps
    assert lrs == pytest.approx([0.001, 0.002, 0.003])  # warmup: (step + 1) / 4 of 0.004


def test_generate_is_greedy_unless_given_a_beam(monkeypatch):
    module, _, _ = fixed_module()
    monkeypatch.setattr("ablate.models.module.beam_search", lambda *a, **kw: pytest.fail("beam search by default"))
    assert module.generate(torch.full((1, 2), A)).tolist() == [[A, B, EOS]]
