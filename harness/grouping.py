"""Which trials train as one model (harness/fused.py): the rules a worker groups eval seeds by and a study's
checks hold `tune.seeds` to. Torch-free, so that checking a study loads no torch."""

from __future__ import annotations

from ablate.models.kinds import FAMILIES
from ablate.schema.config import ExperimentConfig

FUSE_AT_MOST = 16  # seeds in one fused model: the GPU figure's group


def why_not_fused(cfgs: list[ExperimentConfig]) -> str | None:
    """Why these trials' configs cannot train as one model, or None: they must be one variant (equal but for
    the seed), with batches of a fixed number of examples (a token budget gives each seed its own sizes), at
    full precision or under bf16 autocast (fp32 weights, no loss scaling); compiled or not (train.compile)."""
    first = cfgs[0]
    train = first.train
    if any(cfg.model_copy(update={"seed": first.seed}) != first for cfg in cfgs[1:]):
        return "the trials are not one variant"
    if not FAMILIES[first.model.arch].fuses:
        return f"model.arch={first.model.arch} does not fuse seeds (its Family says so)"
    if train.batch_tokens is not None:
        return "train.batch_tokens gives each seed batches of its own sizes"
    if train.precision not in ("auto", "32-true", "bf16-mixed"):
        return f"train.precision={train.precision} (fused seeds train in fp32 or under bf16 autocast)"
    return None


def why_alone(cfg: ExperimentConfig, cuda: bool) -> str | None:
    """Why an eval trial of `cfg` starting afresh trains alone here, or None where it trains fused."""
    if cfg.train.fuse_seeds is False:
        return "train.fuse_seeds: false"
    if not wants_fusion(cfg, cuda):
        return "train.fuse_seeds: auto, which fuses on a GPU only"
    return why_not_fused([cfg])


def wants_fusion(cfg: ExperimentConfig, cuda: bool) -> bool:
    """train.fuse_seeds: true, false, or auto, which fuses where fusion pays: on a GPU, where an unfused step
    waits on Python. On a CPU the step is compute-bound (bench figure h) and validation and testing run
    per seed either way, so the studies' CPU runs keep one trial a model."""
    setting = cfg.train.fuse_seeds
    return setting is True or (setting == "auto" and cuda)
