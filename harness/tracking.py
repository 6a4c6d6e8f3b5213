"""W&B: one run per trial, offline unless credentials exist, never blocking on the network."""

from __future__ import annotations

import netrc
import os
import warnings
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
    """A Lightning WandbLogger around one W&B run, finished on exit (marked failed when the trial raised);
    None when disabled. An online run that cannot reach the server within INIT_TIMEOUT_S is kept offline."""
    if mode == "disabled":
        yield None
        return
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    Path(directory).mkdir(parents=True, exist_ok=True)
    init = dict(
        project=PROJECT, group=group, name=name, job_type=job_type, tags=[t[:64] for t in tags],
        config=config, dir=str(directory), reinit="finish_previous",
    )  # fmt: skip
    try:
        run = wandb.init(mode=mode, settings=settings(wandb), **init)
    except Exception as e:  # wandb raises its own CommError / UsageError, or a timeout
        if mode != "online":
            raise
        warnings.warn(
            f"W&B: cannot start an online run ({type(e).__name__}: {e}); logging offline", stacklevel=2
        )
        run = wandb.init(mode="offline", settings=settings(wandb), **init)
    exit_code = 1
    try:
        yield WandbLogger(experiment=run)
        exit_code = 0
    finally:
        run.finish(exit_code=exit_code)


INIT_TIMEOUT_S = 30


def settings(wandb):
    # No system-metrics sampler per run: trials are short and several share a machine.
    return wandb.Settings(silent=True, init_timeout=INIT_TIMEOUT_S, x_disable_stats=True)
