"""Figure h: K seeds of the quickstart's Transformer trained as one fused model (models/ensemble.py) against
the same K seeds trained one after another, each on its own batches: seed-steps per second, side by side."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from ablate.bench.timing import Figure, interleaved
from ablate.bench.workload import Sizes, random_batch, transformer_config
from ablate.models import build_model
from ablate.models.ensemble import clip_grad_norm_per_seed, fuse_models, seed_dropout
from ablate.models.module import per_seed_loss, token_cross_entropy
from ablate.models.sequences import PAD_ID

# The quickstart study's Transformer and batches (ablations/quickstart.yaml: d_model 64, 2 + 2 layers, no
# dropout, batch 64, reversal of 3-8 tokens), with its lr and the harness's default grad_clip.
QUICKSTART = Sizes(64, 4, 128, 2, 64, 9, 14, steps=10, repeats=7, warmup=1)
CLIP, LR = 1.0, 2e-3


def fused_seeds(device: torch.device) -> int:
    """Seeds per fused model: 4 on a CPU, which is compute-bound at this size already; 16 on a GPU, which a
    single quickstart-size step leaves mostly idle."""
    return 16 if device.type == "cuda" else 4


def stack_batches(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """K batches of B rows -> one of K·B rows, seed-major, each padded to the longest of the K."""
    longest = {key: max(b[key].size(1) for b in batches) for key in batches[0]}
    return {key: torch.cat([F.pad(b[key], (0, longest[key] - b[key].size(1)), value=PAD_ID) for b in batches])
            for key in batches[0]}  # fmt: skip


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
    stacked = [stack_batches(step) for step in batches]

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
