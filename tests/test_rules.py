"""Each training rule of harness/rules.py on its own, against the Lightning behaviour it stands for where
there is one (EarlyStopping, ModelCheckpoint, the Trainer's validation cadence). Through both a trial alone
and a fused group: tests/test_fused_trials.py (history, best step, early stopping, divergence, cadence,
checkpoints) and the token count below."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from test_fused_trials import SEEDS, config

from ablate.harness import rules
from ablate.harness.callbacks import EarlyStop
from ablate.harness.checkpoints import BestCheckpoint
from ablate.harness.fused import Member, run_fused
from ablate.harness.rules import Best, Cost, Divergence, Patience, Schedule
from ablate.harness.trial import build_trainer, run_trial
from ablate.models.sequences import PAD_ID
from ablate.schema.config import TrainConfig

pytestmark = pytest.mark.usefixtures("single_thread")

NAN, INF = math.nan, math.inf


class Scripted(L.LightningModule):
    """Trains nothing; its validations log the scripted val/loss values, one per validation."""

    def __init__(self, scores: list[float]):
        super().__init__()
        self.scores, self.weight = scores, torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.weight * batch).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.scores[min(self.trainer.global_step, len(self.scores)) - 1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def scripted_fit(scores: list[float], callbacks: list, tmp_path) -> L.Trainer:
    """A validation after every step, step k logging scores[k - 1]."""
    trainer = L.Trainer(max_steps=len(scores), val_check_interval=1, check_val_every_n_epoch=None, logger=False,
                        callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, default_root_dir=tmp_path, accelerator="cpu",
                        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks))  # fmt: skip
    data = torch.utils.data.DataLoader(torch.ones(len(scores) + 1, 1))
    trainer.fit(Scripted(scores), data, torch.utils.data.DataLoader(torch.ones(1, 1)))
    return trainer


SEQUENCES = [
    [3.0, 2.0, 2.0, 2.5, 1.5, 1.5, 1.6, 1.7, 1.0],  # ties are no improvement
    [3.0, 2.0, NAN, 1.0],  # a score that is not finite stops at once
    [2.0, 2.5, INF, 1.0],
    [3.0, 2.9, 2.8, 2.7, 2.6],  # never stops
]


@pytest.mark.parametrize("scores", SEQUENCES)
@pytest.mark.parametrize("patience", [1, 2])
def test_patience_stops_where_lightnings_early_stopping_stops(scores, patience, tmp_path):
    lightning = scripted_fit(scores, [EarlyStopping("val/loss", patience=patience, check_on_train_epoch_end=False)], tmp_path / "l")
    ours = scripted_fit(scores, [EarlyStop(patience)], tmp_path / "o")
    assert ours.global_step == lightning.global_step


@pytest.mark.parametrize("scores", [[3.0, 2.0, 2.0, 2.5, 1.5, 1.5], [NAN, 3.0, NAN, 2.0], [2.0, NAN, 2.0, INF]])
def test_best_keeps_the_validation_modelcheckpoint_keeps(scores, tmp_path):
    reference = ModelCheckpoint(tmp_path / "l", filename="{step}", monitor="val/loss", save_weights_only=True)
    ours = BestCheckpoint(tmp_path / "o")
    scripted_fit(scores, [reference, ours], tmp_path)
    assert reference.best_model_path.endswith(f"step={ours.rule.step}.ckpt")
    assert (tmp_path / "o" / "best.ckpt").is_file()
    best = Best()
    chosen = [step for step, score in enumerate(scores, 1) if best.improves(score, step)]
    assert chosen[-1] == ours.rule.step and chosen[0] == 1  # the first validation is always kept


@pytest.mark.parametrize("train", [{"max_steps": 10, "val_every": 3, "checkpoint_every": 4},
                                   {"max_steps": 100, "max_epochs": 2, "val_every": 3, "checkpoint_every": 0}])  # fmt: skip
def test_the_schedule_is_the_trainers(train, tmp_path):
    """The Trainer a trial alone builds validates where Schedule.validates says (and once more at the end,
    ValidateOnStop); a fused group asks Schedule itself."""
    t = TrainConfig(**train)
    schedule, cfg = Schedule(t), config(0, "transformer", patience=None, **train)
    trainer = build_trainer(cfg, [], [], False, str(tmp_path))
    assert (trainer.max_steps, trainer.max_epochs) == (t.max_steps, t.max_epochs or -1)
    result = run_trial(cfg)
    epoch = 13  # 400 examples in batches of 32
    expected = [s for s in range(1, result.steps + 1) if schedule.validates(s, s % epoch == 0)]
    if not expected or expected[-1] != result.steps:
        expected.append(result.steps)  # training ends on a validation
    assert [row["step"] for row in result.history] == expected
    assert schedule.done(result.steps, result.steps // epoch, 0.0)
    assert [s for s in range(1, 11) if schedule.checkpoints(s)] == ([4, 8] if t.checkpoint_every else [])


def test_schedule_done_counts_steps_epochs_and_seconds():
    schedule = Schedule(TrainConfig(max_steps=50, max_epochs=3, max_time=60.0))
    assert not schedule.done(10, 2, 59.0)
    assert schedule.done(50, 0, 0.0) and schedule.done(10, 3, 0.0) and schedule.done(10, 0, 60.0)


def test_divergence_names_the_loss_or_the_weights():
    rule, finite = Divergence(), [torch.ones(3)]
    rule.observe(torch.tensor(1.0))
    assert rule.failure(4, finite) is None
    assert str(rule.failure(4, [torch.tensor([1.0, NAN])])) == "diverged: weights are not finite at step 4"
    rule.observe(torch.tensor(INF))
    rule.observe(torch.tensor(1.0))  # a finite loss after does not clear it
    assert str(rule.failure(7, finite)) == "diverged: train/loss is not finite (by step 7)"


def test_cost_counts_real_tokens_and_leaves_validation_time_out(monkeypatch):
    clock = iter([0.0, 10.0, 10.0, 25.0, 30.0, 30.0])  # start, a validation from 10 s to 25 s, the end at 30
    monkeypatch.setattr(rules.time, "perf_counter", lambda: next(clock))
    cost = Cost()
    cost.start(torch.device("cpu"))
    batch = {"src": torch.tensor([[5, 6, PAD_ID], [7, 8, 9]]), "tgt_out": torch.tensor([[5, PAD_ID], [6, 7]])}
    cost.count(batch)
    cost.lap()
    cost.resume()
    cost.count(batch)
    cost.finish(torch.device("cpu"))
    assert (cost.tokens, cost.train_seconds) == (16, 15.0)
    assert cost.tokens_per_sec == pytest.approx(16 / 15) and cost.peak_mem_mb > 0


def test_a_fused_seed_counts_the_tokens_its_trial_alone_counts(monkeypatch):
    counted: list[int] = []
    finish = Cost.finish

    def recorded(self, device):
        finish(self, device)
        counted.append(self.tokens)

    monkeypatch.setattr(Cost, "finish", recorded)
    for seed in SEEDS[:2]:
        run_trial(config(seed, "transformer", max_steps=8))
    alone, counted[:] = list(counted), []
    run_fused([Member(config(seed, "transformer", max_steps=8)) for seed in SEEDS[:2]])
    assert counted == alone and alone[0] > 0


def test_patience_counts_from_its_best():
    rule = Patience(2)
    assert [rule.stops(s) for s in (3.0, 2.0, 2.0, 1.0, 1.5, 1.5)] == [False, False, False, False, False, True]
    assert (rule.best, rule.wait) == (1.0, 2)
