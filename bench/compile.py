"""Compiled steps: a training step compiled whole (models/steps.py, train.compile) against the same step
eager, at the quickstart's size and at a GPU profile's (j); and a step inside a trial against the same step
in a plain loop captured as one CUDA graph, the floor a step can reach on a GPU (k)."""

from __future__ import annotations

import copy
import time

import torch

from ablate.bench.timing import Figure, interleaved, skipped, synchronize
from ablate.bench.training import overhead_config, trial_step_seconds
from ablate.bench.workload import Sizes, random_batch, transformer_config
from ablate.models import build_model
from ablate.models.sequences import PAD_ID
from ablate.models.steps import compiled, padded_batch, training_loss

# Sizes(d_model, heads, d_ff, layers, batch, longest length, vocab): the quickstart's trial, a GPU profile's
SIZES = {
    "quickstart": Sizes(64, 4, 128, 2, 64, 10, 14, steps=20, repeats=5),
    "profile": Sizes(256, 4, 1024, 4, 64, 40, 64, steps=3, repeats=3),
}
QUICK = {"quickstart": Sizes(32, 2, 64, 1, 16, 8, 14, steps=5, repeats=2)}


def step_closure(model, batch, steps: int, loss_fn):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        for _ in range(steps):
            loss = loss_fn(model, batch["src"], batch["tgt_in"], batch["tgt_out"], 0.0)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()

    return run


def bench_compile(device: torch.device, quick: bool) -> list[Figure]:
    """j: eager step time / compiled step time, fp32, dropout 0 (what compiles), one figure a size. The
    compile time is in the detail: a run pays it once per process and shape."""
    figures = []
    for name, sizes in (QUICK if quick else SIZES).items():
        torch.manual_seed(0)
        eager_model = build_model(transformer_config(sizes, dropout=0.0), sizes.vocab, sizes.vocab, PAD_ID)
        model = copy.deepcopy(eager_model).to(device).train()
        eager_model.to(device).train()
        batch = random_batch(sizes, device)
        torch.compiler.reset()
        step = compiled(training_loss, device.type)
        start = time.perf_counter()
        step_closure(model, padded_batch(batch), 1, step)()
        synchronize(device)
        compile_s = time.perf_counter() - start
        seconds = interleaved(
            {"eager": step_closure(eager_model, batch, sizes.steps, training_loss),
             "compiled": step_closure(model, padded_batch(batch), sizes.steps, step)},
            device, sizes.repeats, sizes.warmup, sizes.budget_s,
        )  # fmt: skip
        figure = Figure(
            f"j_compile_{name}", f"training step at the {name} size, eager time / compiled time",
            seconds["eager"] / seconds["compiled"], "x",
            detail={"eager_ms": 1e3 * seconds["eager"] / sizes.steps, "compiled_ms": 1e3 * seconds["compiled"] / sizes.steps,
                    "compile_s": compile_s, "d_model": sizes.d_model, "layers": sizes.layers, "batch": sizes.batch,
                    "length": sizes.length},
        )  # fmt: skip
        figures.append(figure.judge(">=", 1.0) if device.type == "cuda" else figure)
    torch.compiler.reset()
    return figures


def bench_captured(device: torch.device, quick: bool) -> Figure:
    """k (CUDA): a trial's step (Lightning, the harness's callbacks, train.compile auto) at the quickstart's
    size over the same step in a plain loop captured whole as one CUDA graph (static batch, AdamW with
    capturable state), time per step."""
    key, what = "k_trial_vs_captured", "a trial's step time / the step captured as one CUDA graph"
    if device.type != "cuda":
        return skipped(key, what, "CUDA graphs need a CUDA device", target="<= 2")
    cfg = overhead_config(quick)
    trial_s = trial_step_seconds(cfg, device)
    sizes = SIZES["quickstart"]
    torch.manual_seed(0)
    model = build_model(cfg.model, sizes.vocab, sizes.vocab, PAD_ID).to(device).train()
    batch = padded_batch(random_batch(sizes, device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=True)

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)  # inside the graph: each replay starts from zero gradients
        loss = training_loss(model, batch["src"], batch["tgt_in"], batch["tgt_out"], 0.0)
        loss.backward()
        optimizer.step()

    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch.cuda.graph asks
        for _ in range(3):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    steps = sizes.steps
    seconds = interleaved({"captured": lambda: [graph.replay() for _ in range(steps)]}, device, sizes.repeats)
    captured_s = seconds["captured"] / steps
    figure = Figure(
        key, what, trial_s / captured_s, "x",
        detail={"trial_step_ms": 1e3 * trial_s, "captured_step_ms": 1e3 * captured_s, "d_model": cfg.model.d_model},
    )  # fmt: skip
    return figure.judge("<=", 2.0)
