"""W&B: one run per trial, offline unless credentials exist, never blocking on the network."""

from __future__ import annotations

import netrc
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

WandbMode = Literal["online", "offline", "disabled"]
PROJECT = os.environ.get("WANDB_PROJECT", "attention-ablate")


def has_credentials() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False


def resolve_mode(requested: WandbMode | None) -> WandbMode:
    """The mode to use: what was asked for, except that online without credentials becomes offline."""
    if requested is None:
        requested = os.environ.get("WANDB_MODE") or ("online" if has_credentials() else "offline")
    if requested in ("dryrun",):
        requested = "offline"
    if requested == "online" and not has_credentials():
        return "offline"
    return requested  # type: ignore[return-value]


@contextmanager
def wandb_logger(
    mode: WandbMode,
    directory: str | Path,
    group: str,
    name: str,
    job_type: str,
    tags: list[str],
    config: dict[str, Any],
) -> Iterator[Any]:
    """A Lightning WandbLogger around one W&B run, finished on exit; None when disabled."""
    if mode == "disabled":
        yield None
        return
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    Path(directory).mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        project=PROJECT, group=group, name=name, job_type=job_type, tags=[t[:64] for t in tags],
        config=config, dir=str(directory), mode=mode, reinit="finish_previous",
        settings=wandb.Settings(silent=True, init_timeout=30, x_disable_stats=True),
    )  # fmt: skip
    try:
        yield WandbLogger(experiment=run)
    finally:
        run.finish()
