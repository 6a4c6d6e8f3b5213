"""Training figures: our Transformer's step against torch.nn.Transformer's (a), the harness's Lightning
overhead against a plain loop (b), the LSTM family's parallel teacher forcing against its step loop (c), the
padding share of length-bucketed batches (e) and bf16 model FLOP utilisation (g)."""

from __future__ import annotations

import copy
import tempfile
from dataclasses import asdict
from typing import Any

import torch
from torch import nn

from ablate.bench.timing import Figure, interleaved, skipped
from ablate.bench.workload import (
    Sizes,
    lstm_configs,
    random_batch,
    real_tokens,
    training_steps,
    transformer_config,
)
from ablate.models import build_model
from ablate.models.config import ModelConfig
from ablate.models.positional_layers import sinusoidal_table
from ablate.models.sequences import PAD_ID
from ablate.models.steps import token_cross_entropy

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


def bench_transformer(sizes: Sizes, device: torch.device) -> Figure:
    cfg = transformer_config(sizes)
    torch.manual_seed(0)
    ours = build_model(cfg, sizes.vocab, sizes.vocab, PAD_ID)
    reference = TorchTransformer(cfg, sizes.vocab)
    batch = random_batch(sizes, device)
    seconds = interleaved(
        {"ours": training_steps(ours, batch, sizes.steps, device),
         "torch": training_steps(reference, batch, sizes.steps, device)},
        device, sizes.repeats, sizes.warmup, sizes.budget_s,
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
    from ablate.schema.config import build_config

    steps = 20 if quick else 100
    return build_config({
        "preset": "transformer",
        "task": {"name": "reverse", "min_len": 3, "max_len": 8, "n_train": 2000, "n_valid": 10, "n_test": 10},
        "model": {"d_model": 32 if quick else 64, "layers": 1 if quick else 2, "heads": 4,
                  "d_ff": 64 if quick else 128, "dropout": 0.0},
        "train": {"batch_size": 64, "lr": 0.002, "max_steps": steps, "val_every": steps},
    })  # fmt: skip


def trial_fit(cfg, device: torch.device):
    """(a closure fitting the trial's module for train.max_steps through the trial's Trainer and cost callback,
    from the same initial weights each call; the module, its data and those weights), no validation."""
    import lightning as L

    from ablate.harness.callbacks import CostMonitor
    from ablate.harness.tasks import build_task
    from ablate.harness.trial import build_module, build_trainer, data_module

    data = build_task(cfg.task, cfg.seed)
    dm = data_module(cfg, data)
    L.seed_everything(cfg.seed, verbose=False)
    module = build_module(cfg, data, dm.eval_splits)
    initial = copy.deepcopy(module.state_dict())
    root = tempfile.mkdtemp(prefix="bench-trial-")

    def fit() -> None:
        module.load_state_dict(initial)
        trainer = build_trainer(cfg, [CostMonitor()], [], False, root)
        trainer.fit(module, train_dataloaders=dm.train_dataloader())

    return fit, module, dm, initial


def trial_step_seconds(cfg, device: torch.device) -> float:
    """Seconds per training step of a trial at `cfg`, after a first fit that pays start-up and compiling."""
    fit, *_ = trial_fit(cfg, device)
    return interleaved({"trial": fit}, device, repeats=3, warmup=1)["trial"] / cfg.train.max_steps


def bench_overhead(device: torch.device, quick: bool, repeats: int) -> Figure:
    from ablate.harness.trial import build_module

    cfg = overhead_config(quick)
    lightning, module, dm, initial = trial_fit(cfg, device)
    plain = build_module(cfg, dm.data, dm.eval_splits)  # its configure_optimizers gives the same AdamW
    steps = cfg.train.max_steps

    def plain_loop() -> None:
        plain.load_state_dict(initial)
        model = plain.model.to(device).train()
        optimizers = plain.configure_optimizers()
        optimizer, schedule = optimizers["optimizer"], optimizers["lr_scheduler"]["scheduler"]
        done = 0
        while done < steps:
            for batch in dm.train_dataloader():
                batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
                # The trial's precision on every device (train.precision: auto is fp32).
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


def bench_lstm(sizes: Sizes, device: torch.device) -> Figure:
    """On a length bucket (train.batch_tokens: one source length per batch), and the Luong pair again on a
    padded batch: there the bidirectional encoder gets packed variable-length input, which CPUs run through
    a per-timestep kernel that both paths share."""
    sizes = sizes.recurrent()
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
    seconds = interleaved(runs, device, sizes.repeats, sizes.warmup, sizes.budget_s)
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


# e. Padding -----------------------------------------------------------------------------------------------


def bench_padding(quick: bool) -> Figure:
    """Reverse with lengths 1-50: token-budget buckets against random batches of 64."""
    from ablate.harness.tasks import build_task
    from ablate.harness.tasks.datamodule import Seq2SeqDataModule
    from ablate.schema.task_config import TaskConfig

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


# g. Model FLOP utilisation -------------------------------------------------------------------------------

# Dense bf16 tensor-core peaks (no sparsity), FLOP/s, from the vendors' data sheets; matched in order.
PEAK_BF16 = (("H100 PCIe", 756e12), ("H100 NVL", 835e12), ("H100", 989e12), ("H200", 989e12),
             ("A100", 312e12))  # fmt: skip


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
                          sizes.warmup, sizes.budget_s)["ours"]  # fmt: skip
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
