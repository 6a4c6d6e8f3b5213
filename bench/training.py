"""`ablate bench`: how fast the harness trains, decodes and sweeps, each figure measured side by side with
its reference in one run, so that the ratios hold on a noisy, shared machine.

Figures (keys of the JSON object; each has a value, a unit, a target and a status):
  a_transformer_step   our Transformer's training tokens/s over torch.nn.Transformer's, same sizes and batch
  b_harness_overhead   Seq2SeqModule through the Lightning Trainer over a plain PyTorch loop, time ratio
  c_lstm_parallel      Luong attention without input feeding: parallel teacher forcing over the step loop
  d_greedy, d_beam     decoding throughput in sentences/s
  e_padding            padding share of token-budget length buckets (against random fixed-size batches)
  f_sweep_scaling      finished trials per hour with K = 1, 2, 4 concurrent worker processes per device
  g_mfu                bf16 model FLOP utilisation of a d_model = 1024, 6 + 6-layer Transformer (CUDA only)

Timing: warm-up calls, then the median of several repeats, with the compared runs interleaved (ABAB...)
so that load from other processes falls on both sides alike.
"""

from __future__ import annotations

import contextlib
import copy
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ablate.harness import provenance
from ablate.models import build_model
from ablate.models.config import ModelConfig
from ablate.models.decoding import beam_search, greedy_decode
from ablate.models.module import token_cross_entropy
from ablate.models.positional_layers import sinusoidal_table
from ablate.models.sequences import BOS_ID, EOS_ID, PAD_ID

# Dense bf16 tensor-core peaks (no sparsity), FLOP/s, from the vendors' data sheets; matched in order.
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
             ("A100", 312e12))  # fmt: skip


@dataclass
class Figure:
    key: str
    what: str
    value: float | None = None
    unit: str = ""
    target: str = ""  # e.g. ">= 1.0"; empty when the figure is for information
    status: str = "info"  # pass | fail | info | skipped
    reason: str = ""  # why it was skipped, or why the target does not apply here
    detail: dict[str, Any] = field(default_factory=dict)

    def judge(self, op: str, threshold: float) -> Figure:
        """Sets target and status from `value op threshold`."""
        self.target = f"{op} {threshold:g}"
        ok = self.value >= threshold if op == ">=" else self.value <= threshold
        self.status = "pass" if ok else "fail"
        return self


def skipped(key: str, what: str, reason: str, target: str = "") -> Figure:
    return Figure(key, what, target=target, status="skipped", reason=reason)


@dataclass(frozen=True)
class Sizes:
    """Model and batch sizes of one bench run; the CPU ones are small enough for a shared laptop-class CPU."""

    d_model: int
    heads: int
    d_ff: int
    layers: int
    batch: int
    length: int  # longest source / target in the synthetic batches; lengths are drawn in [length/2, length]
    vocab: int
    steps: int  # training steps per timed repeat
    repeats: int
    warmup: int = 1


def bench_sizes(device: torch.device, quick: bool) -> Sizes:
    if device.type == "cuda":
        if quick:
            return Sizes(256, 4, 1024, 2, 32, 64, 1000, steps=3, repeats=3)
        return Sizes(512, 8, 2048, 6, 64, 128, 8000, steps=10, repeats=7, warmup=3)
    if quick:
        return Sizes(32, 2, 64, 1, 8, 12, 32, steps=1, repeats=1)
    return Sizes(128, 4, 512, 2, 32, 32, 64, steps=3, repeats=5)


# Timing ------------------------------------------------------------------------------------------------


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def interleaved(
    runs: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 1
) -> dict[str, float]:
    """Median seconds of each run; every repeat calls each run once, in turn (ABAB...)."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            synchronize(device)
            start = time.perf_counter()
            run()
            synchronize(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def autocast(device: torch.device):
    """bf16 autocast on CUDA (what train.precision=auto gives there); full precision on CPU, as the harness."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


# Synthetic batches and training steps ------------------------------------------------------------------


def random_batch(
    sizes: Sizes, device: torch.device, seed: int = 0, padded: bool = True
) -> dict[str, torch.Tensor]:
    """src (B, S), tgt_in / tgt_out (B, T) of random tokens; with `padded`, lengths vary in [S/2, S]."""
    g = torch.Generator().manual_seed(seed)
    b, n = sizes.batch, sizes.length
    lengths = torch.randint(n // 2, n + 1, (b,), generator=g) if padded else torch.full((b,), n)
    positions = torch.arange(n + 1)[None]
    src = torch.randint(4, sizes.vocab, (b, n), generator=g).masked_fill(
        positions[:, :n] >= lengths[:, None], PAD_ID
    )
    tgt = torch.randint(4, sizes.vocab, (b, n + 1), generator=g).masked_fill(
        positions > lengths[:, None], PAD_ID
    )
    tgt[:, 0] = BOS_ID
    batch = {"src": src, "tgt_in": tgt[:, :-1], "tgt_out": tgt[:, 1:]}
    return {k: v.to(device) for k, v in batch.items()}


def real_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Source plus target tokens without padding: what the harness's tokens/s counts."""
    return int((batch["src"] != PAD_ID).sum() + (batch["tgt_out"] != PAD_ID).sum())


def training_steps(model: nn.Module, batch: dict[str, torch.Tensor], steps: int, device: torch.device):
    """A closure running `steps` AdamW steps of teacher-forced cross entropy on one batch, in train mode."""
    model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        for _ in range(steps):
            with autocast(device):
                loss = token_cross_entropy(model(batch["src"], batch["tgt_in"]), batch["tgt_out"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return run


# a. Transformer training step against torch.nn.Transformer ----------------------------------------------


class TorchTransformer(nn.Module):
    """The reference: torch.nn.Transformer inside the same embeddings, sinusoid and output layer as ours,
    post-LN without the final norms nn.Transformer adds (ours has none in post-LN), same dropout."""

    def __init__(self, cfg: ModelConfig, vocab: int):
        super().__init__()
        d = cfg.d_model
        self.src_embed = nn.Embedding(vocab, d, padding_idx=PAD_ID)
        self.tgt_embed = nn.Embedding(vocab, d, padding_idx=PAD_ID)
        self.register_buffer("positions", sinusoidal_table(cfg.max_positions, d), persistent=False)
        self.embed_scale = d**0.5
        self.dropout = nn.Dropout(cfg.dropout)
        self.core = nn.Transformer(
            d, cfg.heads, cfg.layers, cfg.layers, cfg.d_ff, cfg.dropout, batch_first=True
        )
        self.core.encoder.norm = self.core.decoder.norm = None
        self.generator = nn.Linear(d, vocab)

    def _embed(self, embedding: nn.Embedding, tokens: torch.Tensor) -> torch.Tensor:
        return self.dropout(embedding(tokens) * self.embed_scale + self.positions[: tokens.size(1)])

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        src_pad, tgt_pad = src == PAD_ID, tgt_in == PAD_ID  # True = ignore, torch's convention
        t = tgt_in.size(1)
        causal = torch.ones(t, t, dtype=torch.bool, device=src.device).triu(1)
        out = self.core(
            self._embed(self.src_embed, src), self._embed(self.tgt_embed, tgt_in), tgt_mask=causal,
            src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad, memory_key_padding_mask=src_pad,
            tgt_is_causal=True,
        )  # fmt: skip
        return self.generator(out)


def transformer_config(sizes: Sizes, dropout: float = 0.1) -> ModelConfig:
    return ModelConfig(
        arch="transformer", d_model=sizes.d_model, heads=sizes.heads, d_ff=sizes.d_ff, layers=sizes.layers,
        dropout=dropout, norm="post", pos_encoding="sinusoidal",
    )  # fmt: skip


def bench_transformer(sizes: Sizes, device: torch.device) -> Figure:
    cfg = transformer_config(sizes)
    torch.manual_seed(0)
    ours = build_model(cfg, sizes.vocab, sizes.vocab, PAD_ID)
    reference = TorchTransformer(cfg, sizes.vocab)
    batch = random_batch(sizes, device)
    seconds = interleaved(
        {"ours": training_steps(ours, batch, sizes.steps, device),
         "torch": training_steps(reference, batch, sizes.steps, device)},
        device, sizes.repeats, sizes.warmup,
    )  # fmt: skip
    tokens = real_tokens(batch) * sizes.steps
    rate = {name: tokens / s for name, s in seconds.items()}
    figure = Figure(
        "a_transformer_step", "Transformer training tokens/s, ours / torch.nn.Transformer",
        rate["ours"] / rate["torch"], "x",
        detail={"ours_tokens_per_s": rate["ours"], "torch_tokens_per_s": rate["torch"],
                "params": sum(p.numel() for p in ours.parameters()),
                "torch_params": sum(p.numel() for p in reference.parameters()), "sizes": asdict(sizes)},
    )  # fmt: skip
    return figure.judge(">=", 1.0)


# b. Harness overhead: Lightning against a plain loop -----------------------------------------------------


def overhead_config(quick: bool):
    """The quickstart study's trial settings (reverse, d_model 64), without validation."""
    from ablate.harness.config import build_config

    steps = 20 if quick else 100
    return build_config({
        "preset": "transformer",
        "task": {"name": "reverse", "min_len": 3, "max_len": 8, "n_train": 2000, "n_valid": 10, "n_test": 10},
        "model": {"d_model": 32 if quick else 64, "layers": 1 if quick else 2, "heads": 4,
                  "d_ff": 64 if quick else 128, "dropout": 0.0},
        "train": {"batch_size": 64, "lr": 0.002, "max_steps": steps, "val_every": steps},
    })  # fmt: skip


def bench_overhead(device: torch.device, quick: bool, repeats: int) -> Figure:
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ablate.harness.callbacks import CostMonitor
    from ablate.harness.tasks import build_task
    from ablate.harness.tasks.datamodule import Seq2SeqDataModule
    from ablate.harness.trial import build_module, build_trainer

    cfg = overhead_config(quick)
    data = build_task(cfg.task, cfg.seed)
    dm = Seq2SeqDataModule(data, cfg.train.batch_size, cfg.seed)
    L.seed_everything(cfg.seed, verbose=False)
    module = build_module(cfg, data, dm.eval_splits)
    plain = build_module(cfg, data, dm.eval_splits)  # its configure_optimizers gives the same AdamW
    initial = copy.deepcopy(module.state_dict())
    steps, root = cfg.train.max_steps, tempfile.mkdtemp(prefix="bench-overhead-")

    def lightning() -> None:
        module.load_state_dict(initial)
        # The trial's Trainer and cost callback; no validation, so nothing selects a checkpoint to save.
        callbacks = [CostMonitor(), ModelCheckpoint(dirpath=root, save_top_k=0)]
        loader = dm.train_dataloader()
        trainer = build_trainer(cfg, callbacks, [], False, len(loader), root)
        trainer.fit(module, train_dataloaders=loader)

    def plain_loop() -> None:
        plain.load_state_dict(initial)
        model = plain.model.to(device).train()
        optimizers = plain.configure_optimizers()
        optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
        done = 0
        while done < steps:
            for batch in dm.train_dataloader():
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                with autocast(device):
                    logits = model(batch["src"], batch["tgt_in"])
                    loss = token_cross_entropy(logits, batch["tgt_out"], cfg.train.label_smoothing)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
                optimizer.step()
                schedule.step()
                done += 1
                if done == steps:
                    break

    seconds = interleaved({"lightning": lightning, "plain": plain_loop}, device, repeats, warmup=1)
    figure = Figure(
        "b_harness_overhead", "Seq2SeqModule + Lightning Trainer time / plain PyTorch loop time",
        seconds["lightning"] / seconds["plain"], "x",
        detail={"lightning_s": seconds["lightning"], "plain_s": seconds["plain"], "steps": steps,
                "batch_size": cfg.train.batch_size, "d_model": cfg.model.d_model},
    )  # fmt: skip
    figure.judge("<=", 1.10)
    if device.type != "cpu":
        figure.status, figure.reason = "info", "the target is set for CPU runs"
    return figure


# c. LSTM family: parallel teacher forcing against the step loop -----------------------------------------


def lstm_configs(sizes: Sizes) -> dict[str, ModelConfig]:
    common = dict(arch="lstm", d_model=sizes.d_model, layers=sizes.layers, dropout=0.1)
    return {
        "lstm": ModelConfig(**common, attention="none"),
        "lstm-bahdanau": ModelConfig(**common, attention="additive", attention_query="previous"),
        # Luong's dot score with h_t, no input feeding: nothing from step t-1 enters step t.
        "luong-parallel": ModelConfig(
            **common, attention="dot", attention_query="current", input_feeding=False
        ),
    }


def bench_lstm(sizes: Sizes, device: torch.device) -> Figure:
    """On a length bucket (train.batch_tokens: one source length per batch), and the Luong pair again on a
    padded batch: there the bidirectional encoder gets packed variable-length input, which CPUs run through
    a per-timestep kernel that both paths share."""
    torch.manual_seed(0)
    models = {
        name: build_model(cfg, sizes.vocab, sizes.vocab, PAD_ID) for name, cfg in lstm_configs(sizes).items()
    }
    step_loop = copy.deepcopy(models["luong-parallel"])
    step_loop.parallel = False  # the same model forced through its step-by-step path
    models["luong-step-loop"] = step_loop
    bucket, padded = random_batch(sizes, device, padded=False), random_batch(sizes, device)
    runs = {name: training_steps(model, bucket, sizes.steps, device) for name, model in models.items()}
    for name in ("luong-parallel", "luong-step-loop"):
        runs[f"{name}-padded"] = training_steps(models[name], padded, sizes.steps, device)
    seconds = interleaved(runs, device, sizes.repeats, sizes.warmup)
    tokens = {
        name: real_tokens(padded if name.endswith("-padded") else bucket) * sizes.steps for name in runs
    }
    detail: dict[str, Any] = {f"{name}_tokens_per_s": tokens[name] / s for name, s in seconds.items()}
    detail["padded_batch_ratio"] = seconds["luong-step-loop-padded"] / seconds["luong-parallel-padded"]
    figure = Figure(
        "c_lstm_parallel", "Luong (no input feeding) tokens/s, parallel path / step loop, length-bucketed batch",
        seconds["luong-step-loop"] / seconds["luong-parallel"], "x", detail={**detail, "sizes": asdict(sizes)},
    )  # fmt: skip
    return figure.judge(">=", 3.0)


# d. Decoding ----------------------------------------------------------------------------------------------


def bench_decoding(sizes: Sizes, device: torch.device, beam_size: int = 4) -> list[Figure]:
    """Sentences/s of greedy and beam search, every sentence decoded to `sizes.length` tokens (untrained
    models rarely end early, so the lengths are fixed for both searches)."""
    torch.manual_seed(0)
    families = {"transformer": transformer_config(sizes),
                "lstm-bahdanau": lstm_configs(sizes)["lstm-bahdanau"]}  # fmt: skip
    src = random_batch(sizes, device)["src"]
    runs = {}
    for family, cfg in families.items():
        model = build_model(cfg, sizes.vocab, sizes.vocab, PAD_ID).to(device).eval()
        runs[f"{family}_greedy"] = lambda m=model: greedy_decode(
            m, src, BOS_ID, EOS_ID, PAD_ID, max_len=sizes.length
        )
        runs[f"{family}_beam"] = lambda m=model: beam_search(
            m, src, BOS_ID, EOS_ID, PAD_ID, beam_size, max_len=sizes.length
        )
    with torch.inference_mode(), autocast(device):
        seconds = interleaved(runs, device, sizes.repeats, sizes.warmup)
    rate = {name: src.size(0) / s for name, s in seconds.items()}
    common = {"batch": src.size(0), "max_len": sizes.length, "beam_size": beam_size}
    return [
        Figure(f"d_{search}", f"{search} decoding, Transformer, sentences/s", rate[f"transformer_{search}"],
               "sentences/s", detail={**{k: v for k, v in rate.items() if k.endswith(search)}, **common})
        for search in ("greedy", "beam")
    ]  # fmt: skip


# e. Padding -----------------------------------------------------------------------------------------------


def bench_padding(quick: bool) -> Figure:
    """Reverse with lengths 1-50: token-budget buckets against random batches of 64."""
    from ablate.harness.config import TaskConfig
    from ablate.harness.tasks import build_task
    from ablate.harness.tasks.datamodule import Seq2SeqDataModule

    data = build_task(TaskConfig(name="reverse", min_len=1, max_len=50, n_train=1000 if quick else 10000,
                                 n_valid=10, n_test=10), seed=0)  # fmt: skip
    batch_size, budget = 64, 64 * 26  # the budget holds 64 examples of the mean padded length
    bucketed = Seq2SeqDataModule(data, batch_size, 0, batch_tokens=budget)
    random = Seq2SeqDataModule(data, batch_size, 0)
    figure = Figure(
        "e_padding", "padding share of training batches, token-budget length buckets",
        bucketed.padding_fraction("train"), "fraction",
        detail={"random_batches": random.padding_fraction("train"), "batch_size": batch_size,
                "batch_tokens": budget, "lengths": [1, 50]},
    )  # fmt: skip
    return figure.judge("<=", 0.15)


# f. Sweep throughput -------------------------------------------------------------------------------------


def sweep_spec(k: int, trials: int):
    from ablate.harness.study.spec import StudySpec

    return StudySpec(
        name=f"bench-sweep-k{k}",
        base={"preset": "transformer",
              "task": {"name": "reverse", "min_len": 2, "max_len": 6, "n_train": 500, "n_valid": 50, "n_test": 50},
              "model": {"d_model": 32, "layers": 1, "heads": 2, "d_ff": 64, "dropout": 0.0},
              "train": {"batch_size": 32, "max_steps": 60, "val_every": 30}},
        seeds=list(range(trials)),
    )  # fmt: skip


@contextlib.contextmanager
def output_to(path: Path):
    """Points this process's stdout and stderr file descriptors at `path` (children inherit them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)


def sweep_rate(k: int, trials: int, device: torch.device, root: Path) -> tuple[float, float, int]:
    """Runs a fresh study of `trials` tiny trials with k local worker processes (`ablate sweep`'s own
    spawning); returns (trials per hour, seconds, finished trials). Worker start-up counts: every sweep pays it."""
    import optuna

    from ablate.harness.artifacts import default_storage_url
    from ablate.harness.study.queue import prepare_study, study_progress
    from ablate.harness.study.storage import open_storage
    from ablate.harness.workers import spawn_workers, worker_slots

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = sweep_spec(k, trials)
    url = default_storage_url(spec.slug, root)
    store = open_storage(url)
    prepare_study(spec, store)
    if device.type == "cuda":
        slots = worker_slots(None, [str(device.index or 0)], k)
    else:
        slots = worker_slots(k, None, 1)
    log = root / f"workers-k{k}.log"
    start = time.perf_counter()
    with output_to(log):
        procs = spawn_workers(spec.name, url, root, "disabled", slots)
    for proc in procs:
        proc.wait()
    seconds = time.perf_counter() - start
    if any(p.returncode for p in procs):
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"a K={k} worker failed: {' | '.join(tail)}")
    done = sum(row.done for row in study_progress(spec, store))
    return done * 3600 / seconds, seconds, done


def bench_sweep(device: torch.device, quick: bool) -> Figure:
    what = "finished trials/hour with K = 4 concurrent trials per device / K = 1"
    if quick:
        return skipped("f_sweep_scaling", what, "--quick: each worker process takes seconds to start",
                       target=">= 2.5 (GPU)")  # fmt: skip
    detail: dict[str, Any] = {"trials": 8, "trial": "reverse, d_model 32, 1 + 1 layers, 60 steps"}
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as tmp:
        for k in (1, 2, 4):
            rate, seconds, done = sweep_rate(k, 8, device, Path(tmp))
            detail[f"k{k}_trials_per_hour"], detail[f"k{k}_seconds"], detail[f"k{k}_done"] = (
                rate,
                seconds,
                done,
            )
    figure = Figure("f_sweep_scaling", what, detail["k4_trials_per_hour"] / detail["k1_trials_per_hour"], "x",
                    detail=detail)  # fmt: skip
    figure.judge(">=", 2.5)
    if device.type != "cuda":
        figure.status = "info"
        figure.reason = (
            f"the target is set for a GPU; {os.cpu_count()} CPU cores are shared by the K processes"
        )
    return figure


# g. Model FLOP utilisation -------------------------------------------------------------------------------


def transformer_train_flops(cfg: ModelConfig, batch: int, src_len: int, tgt_len: int, vocab: int) -> float:
    """Matmul FLOPs of one training step (forward + backward = 3 x forward) of an encoder-decoder
    Transformer; the causal self-attention counts its lower triangle only."""
    d, ff, s, t = cfg.d_model, cfg.d_ff, src_len, tgt_len
    encoder = 2 * s * (4 * d * d + 2 * d * ff) + 4 * s * s * d
    decoder = (2 * t * (4 * d * d + 2 * d * ff) + 2 * t * t * d  # self-attention and feed-forward
               + 2 * t * 2 * d * d + 2 * s * 2 * d * d + 4 * t * s * d)  # cross-attention  # fmt: skip
    forward = cfg.layers * (encoder + decoder) + 2 * t * d * vocab
    return 3.0 * batch * forward


def peak_bf16_flops(name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16 if key in name), None)


def bench_mfu(device: torch.device, quick: bool) -> Figure:
    what = "bf16 MFU, Transformer d_model 1024, 6 + 6 layers, training step"
    if device.type != "cuda":
        return skipped("g_mfu", what, "no CUDA device", target=">= 0.4 (H100)")
    sizes = Sizes(1024, 16, 4096, 6, 16 if quick else 64, 256, 32000, steps=2 if quick else 5,
                  repeats=2 if quick else 5, warmup=2)  # fmt: skip
    cfg = transformer_config(sizes)
    torch.manual_seed(0)
    model = build_model(cfg, sizes.vocab, sizes.vocab, PAD_ID)
    batch = random_batch(sizes, device, padded=False)  # every position real, so the FLOP count is exact
    torch.cuda.reset_peak_memory_stats(device)
    seconds = interleaved({"ours": training_steps(model, batch, sizes.steps, device)}, device, sizes.repeats,
                          sizes.warmup)["ours"]  # fmt: skip
    flops = transformer_train_flops(cfg, sizes.batch, sizes.length, sizes.length, sizes.vocab) * sizes.steps
    achieved = flops / seconds
    name = torch.cuda.get_device_name(device)
    peak = peak_bf16_flops(name)
    detail = {"tflops_per_s": achieved / 1e12, "peak_mem_gb": torch.cuda.max_memory_allocated(device) / 2**30,
              "gpu": name, "peak_tflops_per_s": peak / 1e12 if peak else None, "batch": sizes.batch,
              "length": sizes.length, "vocab": sizes.vocab,
              "tokens_per_s": real_tokens(batch) * sizes.steps / seconds}  # fmt: skip
    if peak is None:
        return Figure("g_mfu", what, None, "fraction", ">= 0.4 (H100)", "skipped",
                      f"no bf16 peak on record for {name}", detail)  # fmt: skip
    figure = Figure("g_mfu", what, achieved / peak, "fraction", detail=detail).judge(">=", 0.4)
    if "H100" not in name and "H200" not in name:
        figure.status, figure.reason = "info", "the target is set for an H100"
    return figure


# The whole run ---------------------------------------------------------------------------------------------

FIGURE_KEYS = ("a_transformer_step", "b_harness_overhead", "c_lstm_parallel", "d_greedy", "d_beam",
               "e_padding", "f_sweep_scaling", "g_mfu")  # fmt: skip


def machine(device: torch.device) -> dict[str, Any]:
    info = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu": cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": str(device),
        "commit": provenance.git_commit(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def guarded(key: str, what: str, measure: Callable[[], Figure | list[Figure]]) -> list[Figure]:
    """A figure whose measurement raised is reported as skipped with the error, not lost with the run."""
    try:
        result = measure()
    except Exception as e:  # one broken measurement must not hide the others
        return [skipped(key, what, f"error: {type(e).__name__}: {e}")]
    return result if isinstance(result, list) else [result]


def run_bench(device: torch.device, quick: bool = False, progress: Callable[[str], None] = lambda _: None):
    """Every figure, in order; returns {'machine': ..., 'quick': ..., 'figures': {key: figure dict}}."""
    from ablate.harness.trial import quiet_lightning

    quiet_lightning()
    sizes = bench_sizes(device, quick)
    info = machine(device)
    steps = [
        ("a_transformer_step", "Transformer step", lambda: bench_transformer(sizes, device)),
        ("b_harness_overhead", "harness overhead", lambda: bench_overhead(device, quick, 1 if quick else 7)),
        ("c_lstm_parallel", "LSTM family", lambda: bench_lstm(sizes, device)),
        ("d_greedy", "decoding", lambda: bench_decoding(sizes, device)),
        ("e_padding", "padding", lambda: bench_padding(quick)),
        ("f_sweep_scaling", "sweep throughput", lambda: bench_sweep(device, quick)),
        ("g_mfu", "MFU", lambda: bench_mfu(device, quick)),
    ]
    figures: list[Figure] = []
    for key, what, measure in steps:
        progress(what)
        start = time.perf_counter()
        for figure in guarded(key, what, measure):
            figure.detail["bench_seconds"] = round(time.perf_counter() - start, 2)
            figures.append(figure)
    info["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    return {"machine": info, "quick": quick, "figures": {f.key: asdict(f) for f in figures}}


def resolve_device(requested: str | None) -> torch.device:
    """cuda when asked for (an error without one) or, unasked, when there is one; cpu otherwise."""
    if requested not in (None, "cpu", "cuda"):
        raise ValueError(f"--device: expected cpu or cuda (got {requested!r})")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device: cuda requested, but torch sees no CUDA device")
    if requested is None:
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    return (
        torch.device(requested, torch.cuda.current_device()) if requested == "cuda" else torch.device("cpu")
    )


def format_value(figure: dict[str, Any]) -> str:
    if figure["value"] is None:
        return "-"
    value, unit = figure["value"], figure["unit"]
    if unit == "fraction":
        return f"{value:.1%}"
    return f"{value:.2f}{unit}" if unit == "x" else f"{value:,.1f} {unit}"


def print_table(result: dict[str, Any]) -> None:
    """The figures as a table on stdout, with the machine they were measured on."""
    from rich.console import Console
    from rich.table import Table

    info = result["machine"]
    table = Table(
        title=f"ablate bench on {info['device']} ({info['cpu']}, load {info['load_avg_1_5_15'][0]})"
    )
    for column in ("figure", "value", "target", "status", "detail"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for f in result["figures"].values():
        detail = ", ".join(f"{k}={v:,.4g}" if isinstance(v, float) else f"{k}={v}"
                           for k, v in f["detail"].items() if k != "sizes")  # fmt: skip
        status = f"{f['status']} ({f['reason']})" if f["reason"] else f["status"]
        table.add_row(f"{f['key']}: {f['what']}", format_value(f), f["target"], status, detail)
    Console(width=200).print(table)
