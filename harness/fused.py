"""Seeds of one variant trained as one model (models/ensemble.py): K eval trials of a variant, or the K
seeds a tune candidate is scored on (tune.seeds).

Each seed is prepared as its trial alone prepares it (harness/trial.py `Prepared`: its own data, sampler,
initialisation and dropout generator); one loop trains the fused model: a step stacks each seed's next batch
(K·B rows, seed-major, padded to the longest of the K), trains on the sum of the K mean losses, clips each
seed's gradient norm on its own and takes one AdamW step over the stacked parameters, which is each seed's
own step. Everything else is the trial alone's rules (harness/rules.py), one of each per seed: a seed that
diverges fails alone, with its trial's message, and a stopped seed stays frozen (`ActiveSeeds`) while the
others train on. Validation and the test pass run each seed's plain model with its weights (the test
through Lightning), so every metric, artifact and report row of a seed is the one it gets alone, to float
rounding. The seeds share the wall clock: `wall_time`, `peak_mem_mb` and a `max_time` budget are the
group's, `tokens_per_sec` a seed's own tokens over the group's training time."""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ablate.harness import artifacts, signals
from ablate.harness.checkpoints import FUSED_STATE, Preempted
from ablate.harness.grouping import why_not_fused
from ablate.harness.rules import MONITOR, Best, Cost, Divergence, Patience, Schedule, TrialFailed
from ablate.harness.trial import Prepared, TrialResult, build_trainer, resolve_precision
from ablate.models.ensemble import (
    ActiveSeeds,
    clip_grad_norm_per_seed,
    fuse_models,
    fuse_state_dicts,
    seed_axis,
    seed_dropout,
    seed_state_dict,
)
from ablate.models.module import optimizer_and_schedule
from ablate.models.sequences import PAD_ID
from ablate.models.steps import Steps, seed_losses
from ablate.schema.config import ExperimentConfig
from ablate.schema.errors import ConfigError, RunFailed


@dataclass
class Member:
    """One eval trial of a fused group: config, folder, resume checkpoint (a fused seed's), `publish` for each
    new one (folder, step), `report` for each validation row, and `logger`, its W&B run (a context manager
    giving a logger or None) opened once the group is trained, to get the history and test results then."""

    cfg: ExperimentConfig
    out_dir: Path | None = None
    resume_from: Path | None = None
    publish: Callable[[Path, int], None] | None = None
    report: Callable[[dict[str, float]], None] | None = None
    logger: Callable[[], AbstractContextManager] | None = None


@dataclass
class Seed:
    """One seed's run in the group: its rules (harness/rules.py), one of each as alone; its data position."""

    member: Member
    prepared: Prepared
    epoch: int = 0
    batches_done: int = 0  # of the current epoch
    history: list[dict[str, float]] = field(default_factory=list)  # its validations' rows, as alone
    best: Best = field(default_factory=Best)
    best_state: dict[str, torch.Tensor] | None = None  # the weights of best.step
    patience: Patience | None = None  # train.patience's early stopping
    divergence: Divergence = field(default_factory=Divergence)
    cost: Cost = field(default_factory=Cost)
    stopped: bool = False
    steps: int | None = None  # the step it stopped at (early stopping, divergence); None while it trains
    failure: BaseException | None = None
    last_loss: torch.Tensor | None = None

    def __post_init__(self) -> None:
        patience = self.cfg.train.patience
        self.patience = Patience(patience) if patience is not None else None
        self.sampler = self.prepared.dm.sampler("train", shuffle=True)
        self.batches = self.epochs()

    @property
    def cfg(self) -> ExperimentConfig:
        return self.member.cfg

    @property
    def epoch_ended(self) -> bool:
        """Whether its last batch was the last of an epoch (the next one starts the next epoch)."""
        return self.batches_done == len(self.sampler)

    def epochs(self) -> Iterator[dict[str, torch.Tensor]]:
        """The batches its loader gives: epochs of the seed's own order, from its data position on (read at
        the first batch, so a restored position holds)."""
        dm = self.prepared.dm
        while True:
            self.sampler.resume_at(self.epoch, self.batches_done)
            for indices in self.sampler:
                self.batches_done += 1
                yield dm.collate("train", [dm.encoded["train"][i] for i in indices])
            self.epoch, self.batches_done = self.epoch + 1, 0

    def state(self, group: FusedGroup, k: int) -> dict:
        """Seed k's resume checkpoint: its slices of the weights and AdamW moments, the shared schedule, its
        data position, dropout generator and rules' states (its cost counts from the resumption, as alone)."""
        fused, optimizer, step = group.model, group.optimizer, group.step
        moments = {
            name: {key: seed_axis(t, group.k)[k].clone() for key, t in optimizer.state[p].items()
                   if t.shape == p.shape}
            for name, p in fused.named_parameters() if p in optimizer.state
        }  # fmt: skip
        adam_step = next((s["step"] for s in optimizer.state.values() if "step" in s), None)
        return {
            "format": FUSED_STATE, "step": step, "config": self.cfg.model_dump(),
            "model": seed_state_dict(fused, k), "moments": moments, "adam_step": adam_step,
            "param_groups": optimizer.state_dict()["param_groups"], "scheduler": group.scheduler.state_dict(),
            "data": (self.epoch, self.batches_done), "dropout": group.generators[k].get_state(),
            "history": self.history, "best": dataclasses.asdict(self.best), "best_state": self.best_state,
            "patience": dataclasses.asdict(self.patience) if self.patience else None,
            "stopped": self.stopped, "steps": self.steps,
            "failure": str(self.failure) if self.failure is not None else None,  # a TrialFailed's message
        }  # fmt: skip

    def restore(self, state: dict) -> None:
        self.epoch, self.batches_done = state["data"]
        self.history = list(state["history"])
        self.best, self.best_state = Best(**state["best"]), state["best_state"]
        self.patience = Patience(**state["patience"]) if state["patience"] else None
        self.stopped, self.steps = state["stopped"], state["steps"]
        self.failure = TrialFailed(state["failure"]) if state["failure"] is not None else None


def read_state(path: Path) -> dict:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if state.get("format") != FUSED_STATE:
        raise RunFailed(f"{path}: not a fused seed's checkpoint")
    return state


def stack_batches(batches: list[dict[str, torch.Tensor]], device: torch.device) -> dict[str, torch.Tensor]:
    """K batches of B -> one of K·B, seed-major, each padded to the longest of the K. For a GPU the batch is
    pinned first: a copy from pageable memory would wait for the GPU's queued work, once every step."""
    longest = {name: max(b[name].size(1) for b in batches) for name in batches[0]}
    stacked = {
        name: torch.cat([F.pad(b[name], (0, longest[name] - b[name].size(1)), value=PAD_ID) for b in batches])
        for name in batches[0]
    }
    if device.type != "cuda":
        return stacked
    return {name: t.pin_memory().to(device, non_blocking=True) for name, t in stacked.items()}


class FusedGroup:
    """K eval trials of one variant trained as one model; `run` returns each seed's TrialResult, or the
    exception its trial fails with (it diverged; it trained no step). A stop signal raises Preempted for the
    whole group after every seed's resume checkpoint is saved."""

    def __init__(
        self, members: list[Member], on_validation: Callable[[int, list[dict[str, float]]], None] | None = None
    ):
        """on_validation: after each validation, the step and the rows of the seeds that validated (a tune
        trial scored on several seeds reports their mean there, and may raise optuna.TrialPruned)."""
        self.on_validation = on_validation
        why = why_not_fused([m.cfg for m in members])
        if why:
            raise ConfigError(f"train.fuse_seeds: these seeds cannot train fused: {why}")
        self.start = time.perf_counter()
        self.seeds = [Seed(m, Prepared.of(m.cfg)) for m in members]
        sizes = {len(s.prepared.dm.encoded["train"]) for s in self.seeds}
        if len(sizes) > 1:  # a seed's last batch of an epoch would not line up with the others'
            raise ConfigError(f"train.fuse_seeds: the seeds' training sets differ in size ({sorted(sizes)})")
        self.k = len(members)
        self.cfg = members[0].cfg
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        states = [read_state(m.resume_from) if m.resume_from else None for m in members]
        steps = {state["step"] if state else 0 for state in states}
        if len(steps) > 1:
            raise RunFailed(f"a fused group resumes from one step; its seeds' checkpoints are at {sorted(steps)}")
        self.step = self.resumed_from_step = steps.pop()
        for seed, state in zip(self.seeds, states):
            if state:
                seed.prepared.module.model.load_state_dict(state["model"])
                seed.restore(state)
        self.model = fuse_models([s.prepared.module.model for s in self.seeds]).to(self.device)
        self.generators = seed_dropout(self.model, [s.cfg.seed for s in self.seeds])
        # One kernel for every parameter on a GPU (the fused loop clips per seed itself, so nothing blocks it
        # as Lightning's clipping does for a trial alone); elementwise, so still each seed's own step.
        self.optimizer, self.scheduler = optimizer_and_schedule(
            self.model.parameters(), self.cfg.train, fused=self.device.type == "cuda" or None
        )
        self.active = ActiveSeeds(self.optimizer)
        # The step compiled whole as a trial alone compiles (train.compile), under what Lightning's precision
        # plugin wraps a trial alone's steps in: bf16 autocast for bf16-mixed (the only mixed precision fused
        # seeds take, harness/grouping.py), nothing at full precision.
        self.steps = Steps(self.cfg.train.compile, self.cfg.model)
        bf16 = resolve_precision(self.cfg.train.precision) == "bf16-mixed"
        self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
        if self.step:
            self.restore(states)
        for k, seed in enumerate(self.seeds):
            if seed.stopped:
                self.active.stop(k)
            seed.prepared.module.to(self.device)
        # (K,): the seeds still training, on the device, so a step selects their losses without a copy
        self.training = torch.tensor([not s.stopped for s in self.seeds], device=self.device)

    def restore(self, states: list[dict]) -> None:
        """The shared optimiser and schedule state, and each seed's moments and dropout generator."""
        first = states[0]
        named = dict(self.model.named_parameters())
        optimizer_state = self.optimizer.state_dict()
        ids = dict(zip(named, (i for group in optimizer_state["param_groups"] for i in group["params"])))
        optimizer_state["state"] = {
            ids[name]: {"step": first["adam_step"].clone(), **fuse_state_dicts([s["moments"][name] for s in states])}
            for name in first["moments"]
        }  # fmt: skip
        optimizer_state["param_groups"] = [
            {**saved, "params": group["params"]}
            for saved, group in zip(first["param_groups"], optimizer_state["param_groups"])
        ]
        self.optimizer.load_state_dict(optimizer_state)
        self.scheduler.load_state_dict(first["scheduler"])
        for generator, state in zip(self.generators, states):
            generator.set_state(state["dropout"])

    # Training -------------------------------------------------------------------------------------------

    def run(self) -> list[TrialResult | BaseException]:
        schedule = Schedule(self.cfg.train)
        for seed in self.seeds:
            seed.cost.start(self.device)
        while not all(s.stopped for s in self.seeds):
            self.train_step()
            # Every seed's epoch has as many batches (equal training sets), so they end together.
            epoch_ended = self.seeds[0].epoch_ended
            epochs_done = self.seeds[0].epoch + epoch_ended
            done = schedule.done(self.step, epochs_done, time.perf_counter() - self.start)
            stop = signals.received()
            if schedule.validates(self.step, epoch_ended) or done:
                self.validate()
            if stop or schedule.checkpoints(self.step):
                self.save()
            if stop:
                raise Preempted(stop, self.step)
            if done:
                break
        for k, seed in enumerate(self.seeds):
            seed.cost.finish(self.device)
            if not seed.stopped:
                self.check_divergence(k, seed)
        self.save(last=True)
        return [self.test(k, seed) for k, seed in enumerate(self.seeds)]

    def train_step(self) -> None:
        t, k = self.cfg.train, self.k
        self.model.train()
        batches = [next(seed.batches) for seed in self.seeds]
        batch = stack_batches(batches, self.device)
        with self.autocast:
            total, losses = self.steps.run(seed_losses, self.model, batch, t.label_smoothing, k, self.training)
        total.backward()
        if self.active.stopped:  # a stopped seed's slice may hold NaN: it stays out of every step
            for p in self.model.parameters():
                if p.grad is not None:
                    seed_axis(p.grad, k)[self.active.stopped] = 0
        if t.grad_clip:
            clip_grad_norm_per_seed(self.model, t.grad_clip, k)
        self.lr = float(torch.tensor(self.scheduler.get_last_lr()[0]))  # logged as float32, as self.log does
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        detached = losses.detach()
        for seed, loss, own in zip(self.seeds, detached, batches):
            if not seed.stopped:
                seed.divergence.observe(loss)
                seed.cost.count(own)
                seed.last_loss = loss

    def stop(self, k: int, failure: BaseException | None = None) -> None:
        seed = self.seeds[k]
        seed.failure, seed.stopped, seed.steps = failure, True, self.step
        self.active.stop(k)
        self.training[k] = False

    def check_divergence(self, k: int, seed: Seed) -> bool:
        """Whether the seed diverged (rules.Divergence): its trial then fails alone."""
        weights = (seed_axis(p, self.k)[k] for p in self.model.parameters())
        failure = seed.divergence.failure(self.step, weights)
        if failure is not None:
            self.stop(k, failure)
        return failure is not None

    @torch.no_grad()
    def validate(self) -> None:
        """Each training seed's validation on its plain model, then its rules in the Trainer's order: history
        row, best weights, the trial's report, early stopping. Validation time is left out of every cost."""
        rows = []
        for seed in self.seeds:
            seed.cost.lap()
        for k, seed in enumerate(self.seeds):
            if seed.stopped or self.check_divergence(k, seed):
                continue
            module = seed.prepared.module
            state = seed_state_dict(self.model, k)
            module.model.load_state_dict(state)
            module.eval()
            loader = seed.prepared.dm.val_dataloader()
            with self.autocast:
                metrics = module.validate({name: t.to(self.device) for name, t in batch.items()} for batch in loader)
            trained = {"train/loss": float(seed.last_loss), "train/lr": self.lr}
            row = {"step": self.step, **trained, **metrics}
            seed.history.append(row)
            rows.append(row)
            if seed.best.improves(metrics[MONITOR], self.step):
                seed.best_state = state
            if seed.member.report is not None:
                seed.member.report(row)
            if seed.patience is not None and seed.patience.stops(metrics[MONITOR]):
                self.stop(k)
        for seed in self.seeds:
            seed.cost.resume()
        if rows and self.on_validation is not None:
            self.on_validation(self.step, rows)

    # Checkpoints ----------------------------------------------------------------------------------------

    def save(self, last: bool = False) -> None:
        """Each seed's state in its folder, written whole or not at all: its resume checkpoint, then published;
        `last`, its last checkpoint (the trial alone writes Lightning's), with no resume checkpoint left behind
        unless train.keep_checkpoints."""
        for k, seed in enumerate(self.seeds):
            if seed.member.out_dir is None:  # a seed that keeps no files
                continue
            directory = Path(seed.member.out_dir) / artifacts.CHECKPOINTS
            if last and not seed.cfg.train.keep_checkpoints:
                (directory / artifacts.RESUME_CHECKPOINT).unlink(missing_ok=True)
            path = directory / (artifacts.LAST_CHECKPOINT if last else artifacts.RESUME_CHECKPOINT)
            directory.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")  # a kill mid-write leaves the previous checkpoint whole
            torch.save(seed.state(self, k), partial)
            os.replace(partial, path)
            if not last and seed.member.publish is not None:
                seed.member.publish(directory, self.step)

    # Testing --------------------------------------------------------------------------------------------

    def test(self, k: int, seed: Seed) -> TrialResult | BaseException:
        """The trial alone's test pass on the seed's best weights (its last without a validation), through
        Lightning; the best weights are saved as the trial's best checkpoint."""
        if seed.failure is not None:
            return seed.failure
        if self.step == 0:
            budget = f" within train.max_time={self.cfg.train.max_time} s" if self.cfg.train.max_time else ""
            return RunFailed(f"no optimizer step ran{budget}; the trial reports nothing")
        prepared, out_dir = seed.prepared, seed.member.out_dir
        module = prepared.module
        module.model.load_state_dict(seed.best_state or seed_state_dict(self.model, k))
        evaluation = prepared.evaluation()
        with tempfile.TemporaryDirectory(prefix="trial-test-") as scratch:
            root = str(out_dir) if out_dir is not None else scratch
            trainer = build_trainer(seed.cfg, [evaluation], [], False, root)
            test_metrics = trainer.test(module, datamodule=prepared.dm, verbose=False)
            if out_dir is not None and seed.best_state is not None:
                best = Path(out_dir) / artifacts.CHECKPOINTS / f"{artifacts.BEST_CHECKPOINT}.ckpt"
                trainer.save_checkpoint(best, weights_only=True)
        result = prepared.result(
            seed.steps or self.step, test_metrics, evaluation, seed.history, seed.cost, self.start,
            self.resumed_from_step,
        )  # fmt: skip
        with seed.member.logger() if seed.member.logger else nullcontext() as logger:
            loggers = [logger] if logger is not None else []
            for row in seed.history:
                for lg in loggers:
                    lg.log_metrics({k: v for k, v in row.items() if k != "step"}, step=int(row["step"]))
            prepared.leave(result, out_dir, loggers, self.step)
        return result


def run_fused(
    members: list[Member], on_validation: Callable[[int, list[dict[str, float]]], None] | None = None
) -> list[TrialResult | BaseException]:
    """Trains and tests K trials of one variant as one model (FusedGroup)."""
    return FusedGroup(members, on_validation).run()

