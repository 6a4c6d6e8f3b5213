"""Figure h: K seeds of the quickstart's Transformer trained as one fused model (models/ensemble.py) against
the same K seeds trained one after another, each on its own batches: seed-steps per second, side by side.
Figure i: the same, as whole trials through the harness (harness/fused.py's group against run_trial for each
seed): data, Lightning, validation, the test pass and every artifact included."""

from __future__ import annotations

import copy

import torch

from ablate.bench.timing import Figure, interleaved
from ablate.bench.workload import Sizes, random_batch, transformer_config
from ablate.harness.fused import Member, run_fused, stack_batches
from ablate.harness.trial import run_trial
from ablate.models import build_model
from ablate.models.ensemble import clip_grad_norm_per_seed, fuse_models, seed_dropout
from ablate.models.sequences import PAD_ID
from ablate.models.steps import per_seed_loss, token_cross_entropy
from ablate.schema.config import build_config

# The quickstart study's Transformer and batches (ablations/quickstart.yaml: d_model 64, 2 + 2 layers, no
# dropout, batch 64, reversal of 3-8 tokens), with its lr and the harness's default grad_clip.
QUICKSTART = Sizes(64, 4, 128, 2, 64, 9, 14, steps=10, repeats=7, warmup=1)
CLIP, LR = 1.0, 2e-3


def fused_seeds(device: torch.device) -> int:
    """Seeds per fused model: 4 on a CPU, which is compute-bound at this size already; 16 on a GPU, which a
    single quickstart-size step leaves mostly idle."""
    return 16 if device.type == "cuda" else 4


def bench_fused(device: torch.device, quick: bool) -> Figure:
    k = fused_seeds(device)
    sizes = Sizes(32, 2, 64, 1, 16, 9, 14, steps=2, repeats=1) if quick else QUICKSTART
    cfg = transformer_config(sizes, dropout=0.0)
    models = []
    for seed in range(k):
        torch.manual_seed(seed)
        models.append(build_model(cfg, sizes.vocab, sizes.vocab, PAD_ID).to(device).train())
    fused = fuse_models(copy.deepcopy(models)).train()
    seed_dropout(fused, list(range(k)))
    optimizers = [torch.optim.AdamW(m.parameters(), lr=LR) for m in models]
    fused_optimizer = torch.optim.AdamW(fused.parameters(), lr=LR)
    batches = [[random_batch(sizes, device, seed=1000 * seed + step) for seed in range(k)]
               for step in range(sizes.steps)]  # fmt: skip
    stacked = [stack_batches(step, device) for step in batches]

    def separate() -> None:
        for step in batches:
            for model, optimizer, batch in zip(models, optimizers, step):
                optimizer.zero_grad(set_to_none=True)
                token_cross_entropy(model(batch["src"], batch["tgt_in"]), batch["tgt_out"]).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                optimizer.step()

    def together() -> None:
        for batch in stacked:
            fused_optimizer.zero_grad(set_to_none=True)
            per_seed_loss(fused(batch["src"], batch["tgt_in"]), batch["tgt_out"], k).sum().backward()
            clip_grad_norm_per_seed(fused, CLIP, k)
            fused_optimizer.step()

    seconds = interleaved({"separate": separate, "fused": together}, device, sizes.repeats, sizes.warmup,
                          sizes.budget_s)  # fmt: skip
    rate = {name: k * sizes.steps / s for name, s in seconds.items()}
    figure = Figure(
        "h_fused_seeds", f"{k} fused seeds / the same {k} trained one by one, seed-steps/s, quickstart Transformer",
        rate["fused"] / rate["separate"], "x",
        detail={"seeds": k, "fused_seed_steps_per_s": rate["fused"], "separate_seed_steps_per_s": rate["separate"],
                "d_model": sizes.d_model, "batch_per_seed": sizes.batch},
    )  # fmt: skip
    # On a GPU one trial leaves the device idle: 16 fused seeds should give 10x one trial's rate.
    return figure.judge(">=", 10.0 if device.type == "cuda" else 1.2)


def quickstart_trial(seed: int, quick: bool):
    """A trial of the quickstart's Transformer (ablations/quickstart.yaml), at a bench's budget."""
    steps = 20 if quick else 200
    return build_config({
        "preset": "transformer", "seed": seed,
        "task": {"name": "reverse", "min_len": 3, "max_len": 8, "test_max_len": 12, "vocab_size": 10,
                 "n_train": 2000, "n_valid": 200, "n_test": 200},
        "model": {"d_model": 64, "layers": 2, "heads": 4, "d_ff": 128, "dropout": 0.0},
        "train": {"batch_size": 64, "lr": 2e-3, "max_steps": steps, "val_every": steps // 2, "fuse_seeds": True},
    })  # fmt: skip


def bench_fused_trials(device: torch.device, quick: bool) -> Figure:
    k = fused_seeds(device)
    configs = [quickstart_trial(seed, quick) for seed in range(k)]
    seconds = interleaved({
        "separate": lambda: [run_trial(cfg) for cfg in configs],
        "fused": lambda: run_fused([Member(cfg) for cfg in configs]),
    }, device, repeats=1, warmup=0)  # fmt: skip
    steps = configs[0].train.max_steps
    rate = {name: k * steps / s for name, s in seconds.items()}
    figure = Figure(
        "i_fused_trials", f"{k} seeds as one fused group / the same {k} trials one by one, whole trials, seed-steps/s",
        rate["fused"] / rate["separate"], "x",
        detail={"seeds": k, "steps": steps, "fused_seconds": seconds["fused"],
                "separate_seconds": seconds["separate"]},
    )  # fmt: skip
    # No study may be slower fused than alone; on a GPU the group should keep most of figure h's gain.
    return figure.judge(">=", 4.0 if device.type == "cuda" else 1.0)
