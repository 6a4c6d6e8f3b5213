"""W&B: one run per trial, offline unless credentials exist, never blocking on the network."""

from __future__ import annotations

import netrc
import os
import sys
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ablate.harness import chatter
from ablate.schema.spec import short_name

# What `--wandb` and WANDB_MODE accept: each mode `resolve_mode` and `wandb_logger` run a trial's W&B run in.
MODES = ("online", "offline", "disabled")
OLD_MODES = {"dryrun": "offline"}  # W&B's former names, which WANDB_MODE may still hold -> the mode now
PROJECT = os.environ.get("WANDB_PROJECT", "attention-ablate")


def has_credentials() -> bool:
    """An API key in WANDB_API_KEY, or one in the .netrc entry of the server runs go to (WANDB_BASE_URL,
    a self-hosted one included): its machine is the URL's host[:port], as `wandb login` writes it."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    machine = urllib.parse.urlsplit(base_url()).netloc
    try:
        # Where W&B reads and `wandb login` writes API keys: $NETRC, else ~/.netrc.
        path = Path(os.environ.get("NETRC") or Path.home() / ".netrc").expanduser()
        entry = netrc.netrc(str(path)).authenticators(machine)
    except (FileNotFoundError, netrc.NetrcParseError, OSError):
        return False
    return entry is not None and bool(entry[2])


def resolve_mode(requested: str | None) -> str:
    """The mode to use (one of MODES): what was asked for, except that online becomes offline without
    credentials or when the W&B server cannot be reached within PROBE_TIMEOUT_S (said once, on stderr)."""
    if requested is None:
        requested = os.environ.get("WANDB_MODE") or ("online" if has_credentials() else "offline")
    requested = OLD_MODES.get(requested, requested)
    if requested == "online" and not has_credentials():
        return "offline"
    if requested == "online":
        problem = server_unreachable(base_url())
        if problem:
            go_offline(f"cannot reach {base_url()} ({problem})")
            return "offline"
    return requested


PROBE_TIMEOUT_S = 5.0


def base_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").rstrip("/")


def server_unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why `url` gives no HTTP answer within `timeout` seconds (name lookup included), or None when it
    answers at all: any status means the network is there; the key is W&B's to judge."""
    import threading
    import urllib.error
    import urllib.request

    outcome: list[str | None] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(url, timeout=timeout).close()
            outcome.append(None)
        except urllib.error.HTTPError:
            outcome.append(None)
        except Exception as e:  # URLError, socket timeouts, refused connections
            outcome.append(f"{type(e).__name__}: {getattr(e, 'reason', e)}")

    # A name lookup ignores urlopen's timeout; the thread bounds it.
    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 1)
    return outcome[0] if outcome else f"no answer within {timeout:.0f} s"


_offline_reason: str | None = None  # set once this process has fallen back to offline


def go_offline(reason: str) -> None:
    """Logs offline from now on in this process, saying why once."""
    global _offline_reason
    if _offline_reason is None:
        print(f"W&B: {reason}; logging offline (upload later with `wandb sync`)", file=sys.stderr)
    _offline_reason = reason


@contextmanager
def wandb_logger(
    mode: str,
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
        project=PROJECT, group=group, name=name, job_type=job_type, tags=tags,
        config=config, dir=str(directory), reinit="finish_previous",
    )  # fmt: skip
    if mode == "online" and _offline_reason is not None:
        mode = "offline"
    try:
        run = wandb.init(mode=mode, settings=settings(wandb), **init)
    except Exception as e:  # wandb raises its own CommError / UsageError, or a timeout
        if mode != "online":
            raise
        go_offline(f"cannot start an online run ({type(e).__name__}: {str(e).splitlines()[0]})")
        run = wandb.init(mode="offline", settings=settings(wandb), **init)
    # Validation values reach the summary only through `record_summary`: the last ones are not the
    # trial's result (that is the best checkpoint's), and a sweep reads the summary.
    run.define_metric("val/*", summary="none")
    exit_code = 1
    try:
        yield WandbLogger(experiment=run)
        exit_code = 0
    finally:
        run.finish(exit_code=exit_code)


def record_summary(run, metrics: dict[str, float], best_step: int | None) -> None:
    """The run's summary as the report reads the trial: its metrics (val/* those of the validation with
    the lowest val/loss, whose checkpoint was tested) and val/best_step, the step of that validation."""
    run.summary.update({**metrics, **({"val/best_step": best_step} if best_step is not None else {})})


def run_tags(overrides: dict[str, Any]) -> list[str]:
    """W&B tags of a run's overrides: 'heads=4' for model.heads=4 (W&B keeps 64 characters of a tag)."""
    return [f"{short_name(key)}={value}"[:64] for key, value in overrides.items()]


INIT_TIMEOUT_S = 30


def settings(wandb):
    # No system-metrics sampler per run: trials are short and several share a machine.
    return wandb.Settings(silent=not chatter.verbose(), init_timeout=INIT_TIMEOUT_S, x_disable_stats=True)
