"""Ray: the study's workers as Ray actors on a Ray cluster (the [ray] extra).

Each actor reserves `cpus` CPUs and a `gpus` share of a GPU (0.5: two workers per GPU) and runs one `ablate
worker` process, which Ray pins to the actor's GPU (CUDA_VISIBLE_DEVICES). The sweep watches them as local
processes, forwards a stop signal (each worker checkpoints its trial and queues it again) and writes the
report once all have exited; the last to exit disconnects from Ray, stopping the local cluster the sweep
started, if any. Ray only places the workers; the queue stays Optuna's. The storage URL goes to each actor
as an argument and to its worker in the environment, never on a command line."""

from __future__ import annotations

import math
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, PositiveInt

from ablate.harness.extras import require
from ablate.harness.launchers import Problem
from ablate.harness.launchers.commands import python_command, worker_args
from ablate.schema.errors import ConfigError

CLIENT_PORT = 10001  # Ray Client's, when a ray:// address names none
# Whether problems() connected this process to Ray, so that the sweep's end disconnects it: ray.shutdown()
# also stops the local cluster that ray.init started. Ray's atexit would too, but a sweep stopped by a
# signal ends with os._exit (ablate/cli.py), and the cluster's processes would outlive it.
_connected_here = False


class Options(BaseModel):
    """The study file's `launcher: {ray: {...}}` keys, and `--launch key=value`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    address: str | None = (
        None  # ray.init's: "auto", "ray://head:10001"; none: RAY_ADDRESS, else a new local one
    )
    workers: PositiveInt = 1  # worker processes, in all
    cpus: PositiveFloat = 1.0  # CPUs each (num_cpus); its torch threads are this, rounded up
    gpus: float = Field(0.0, ge=0, le=1)  # each worker's share of a GPU (num_gpus): 1/K puts K on a GPU
    timeout: float = Field(5.0, gt=0, le=600)  # seconds the cluster has to take a Ray connection, in all


def problems(options: Options, url: str, out: Path) -> list[Problem]:
    """Connects to the cluster (or starts a local one) once Ray has connected to its address within
    `timeout` (connection_problem): an address with no cluster is bad input, and a SQLite file is shared
    only when the cluster is this one machine. Ray's workers take `out` as it is."""
    from ablate.harness.study.storage import sqlite_path

    global _connected_here
    try:
        ray = require("ray", extra="ray", feature="--launcher ray")
    except ConfigError as e:
        return [("--launcher", str(e))]
    if not ray.is_initialized():
        address = cluster_address(options.address)
        where = "--launch address" if address == options.address else "RAY_ADDRESS"
        silent = connection_problem(address, options.timeout) if address not in (None, "local") else None
        if silent:
            return [(where, f"{address}: {silent}")]
        try:
            connect(options.address)
        except (ConnectionError, ValueError, RuntimeError) as e:
            return [(where, f"{address or 'a new local cluster'}: no Ray cluster there ({first_line(e)})")]
        _connected_here = True
    nodes = [node for node in ray.nodes() if node["Alive"]]
    db = sqlite_path(url)
    if db is not None and len(nodes) > 1:
        disconnect()
        return [("--storage", f"{db} is a SQLite file, which workers on the cluster's other "
                              f"{len(nodes) - 1} node(s) cannot share: give a PostgreSQL URL")]  # fmt: skip
    return []


def cluster_address(address: str | None) -> str | None:
    """The address ray.init connects to: RAY_ADDRESS stands in for none and "auto", as in ray.init."""
    environment = os.environ.get("RAY_ADDRESS")
    return environment if environment and address in (None, "auto") else address


def connect(address: str | None) -> None:
    """ray.init as the sweep calls it: no dashboard, Ray's logging left as it is."""
    import ray

    ray.init(address=address, include_dashboard=False, configure_logging=False)


def first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def connection_problem(address: str, timeout: float) -> str | None:
    """Why Ray does not connect to `address` within `timeout` seconds in all, or None. First a plain
    connection (nothing listening is said at once, with the system's reason), then ray.init in a child
    process killed at the bound: where something answers that is no Ray cluster ("auto" naming a dead
    cluster's, another service's host:port) ray.init retries for minutes printing C++ warnings, and no call
    of Ray's bounds it. The child's warnings go nowhere; its reason comes on its stdout (probe)."""
    deadline = time.monotonic() + timeout
    if reason := unreachable(address, timeout):
        return reason
    from ablate.harness import signals

    child = subprocess.Popen(
        [sys.executable, "-P", "-c", "from ablate.harness.launchers.ray import probe; probe()", address],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        preexec_fn=signals.die_with_parent(),
    )  # fmt: skip
    try:
        said, _ = child.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return f"no Ray cluster answers there within {timeout:g} s"
    finally:  # on time, or interrupted: no probe outlives the check
        if child.poll() is None:
            child.kill()
            child.wait()
    return None if child.returncode == 0 else f"no Ray cluster there ({said.strip() or child.returncode})"


def probe() -> None:
    """connection_problem's child: connects to argv[1] and lets go; if it cannot, exit 1, reason on stdout."""
    import ray

    try:
        connect(sys.argv[1])
    except Exception as e:  # whatever stops ray.init is the reason: this process exists to say it
        print(first_line(e), flush=True)
        sys.exit(1)
    ray.shutdown()


def unreachable(address: str, timeout: float) -> str | None:
    """Why nothing accepts a connection at a `host:port` or `ray://host[:port]` address within `timeout`
    seconds, or None: ray.init would retry there for minutes, printing its C++ warnings. "auto", "local",
    other schemes and malformed addresses are ray.init's to resolve or refuse, at once."""
    client = address.startswith("ray://")
    if address in ("auto", "local") or ("://" in address and not client):
        return None
    try:
        parts = urlsplit(address if client else f"//{address}")
        host, port = parts.hostname, parts.port or (CLIENT_PORT if client else None)
    except ValueError:  # a port that is no number, or out of range
        return None
    if not host or port is None:
        return None
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        reason = e.strerror or str(e) or type(e).__name__
        return f"nothing answers at {host}:{port} within {timeout:g} s ({reason})"
    return None


def disconnect() -> None:
    """Ends what problems() connected, the local cluster that ray.init started with it."""
    global _connected_here
    if _connected_here:
        import ray

        ray.shutdown()
        _connected_here = False


class WorkerProcess:
    """A Ray actor holding one `ablate worker` process; threaded (max_concurrency=2), so that `stop`
    reaches the process while `run` waits for it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def run(self, args: list[str], env: dict[str, str]) -> int:
        from ablate.harness import signals
        # This actor's own Python, which on another node may live elsewhere than the driver's.
        self.proc = subprocess.Popen([*python_command(sys.executable), *args], env={**os.environ, **env},
                                     preexec_fn=signals.die_with_parent())  # fmt: skip
        return self.proc.wait()

    def stop(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)


class RayWorker:
    """One actor's worker as the sweep watches a local Popen (poll, send_signal, wait, kill, returncode).
    The last of `group` to end, done or stopped, disconnects from Ray: no Ray process outlives the sweep."""

    def __init__(self, actor, result, group: list[RayWorker]) -> None:
        self.actor, self.result, self.group = actor, result, group
        self.returncode: int | None = None

    def poll(self) -> int | None:
        import ray

        if self.returncode is None and ray.wait([self.result], timeout=0)[0]:
            try:
                self.returncode = ray.get(self.result)
            except ray.exceptions.RayError:  # the actor or its node died: its trial comes back by heartbeat
                self.returncode = 1
            if all(worker.returncode is not None for worker in self.group):
                disconnect()
        return self.returncode

    def send_signal(self, signum: signal.Signals) -> None:
        self.actor.stop.remote(int(signum))

    def wait(self, timeout: float | None = None) -> int:
        import ray

        if self.returncode is None and not ray.wait([self.result], timeout=timeout)[0]:
            raise subprocess.TimeoutExpired("ray worker", timeout)
        return self.poll()

    def kill(self) -> None:
        import ray

        ray.kill(self.actor)  # its worker gets SIGTERM as its parent dies (signals.die_with_parent)


# The driver's settings that a worker reads from its environment: an actor on another node has that node's
# environment, so the sweep's own checks (the SWORD library it found, its W&B project) would not hold there.
DRIVER_SETTINGS = (
    "SWORD_PATH", "WANDB_MODE", "WANDB_PROJECT", "WANDB_BASE_URL", "ABLATE_DEBUG", "ABLATE_VERBOSE"
)  # fmt: skip


def worker_environment(url: str, gpus: float) -> dict[str, str]:
    """What a worker adds to its node's environment: the storage, driver settings, no GPU if given none."""
    settings = {name: os.environ[name] for name in DRIVER_SETTINGS if name in os.environ}
    return {"ABLATE_STORAGE": url, **settings, **({} if gpus else {"CUDA_VISIBLE_DEVICES": ""})}


def start(
    spec, url: str, out: Path, wandb_mode: str, artifacts: str | None, options: Options
) -> list[RayWorker]:
    import ray

    args = worker_args(spec.name, Path(out).resolve(), wandb_mode, math.ceil(options.cpus), artifacts)
    env = worker_environment(url, options.gpus)
    actor = ray.remote(WorkerProcess).options(num_cpus=options.cpus, num_gpus=options.gpus, max_concurrency=2)
    workers: list[RayWorker] = []
    for _ in range(options.workers):
        handle = actor.remote()
        workers.append(RayWorker(handle, handle.run.remote(args, env), workers))
    print(f"Ray: {options.workers} worker(s), {options.cpus:g} CPU(s) and {options.gpus:g} GPU each, on "
          f"{len([n for n in ray.nodes() if n['Alive']])} node(s)", flush=True)  # fmt: skip
    return workers
