"""The rotate task: the input rotated left by task.plugin.rotate.shift symbols, so output j reads input
(j + shift) mod n: a rule of relative positions that wraps around at the sequence's end."""

from __future__ import annotations

from ablate.harness.tasks.synthetic import symbol_sampler, symbol_task
from ablate.models.plugins import settings


def build(cfg, seed: int):
    shift = settings(cfg, "rotate").shift

    def rotate(src: tuple[str, ...]):
        n = len(src)
        return src[shift % n :] + src[: shift % n], tuple(((j + shift) % n, j) for j in range(n))

    symbols = [str(i) for i in range(cfg.vocab_size)]
    return symbol_task("rotate", symbol_sampler(symbols, rotate), symbols, cfg, seed)
