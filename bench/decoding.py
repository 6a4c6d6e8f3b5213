"""Decoding figures (d): greedy and beam search throughput of an untrained Transformer and LSTM."""

from __future__ import annotations

import torch

from ablate.bench.timing import Figure, autocast, interleaved
from ablate.bench.workload import Sizes, lstm_configs, random_batch, transformer_config
from ablate.models import build_model
from ablate.models.decoding import beam_search, greedy_decode
from ablate.models.sequences import BOS_ID, EOS_ID, PAD_ID


def bench_decoding(sizes: Sizes, device: torch.device, beam_size: int = 4) -> list[Figure]:
    """Sentences/s of greedy and beam search, every sentence decoded to `sizes.length` tokens (untrained
    models rarely end early, so the lengths are fixed for both searches)."""
    torch.manual_seed(0)
    families = {"transformer": transformer_config(sizes),
                "lstm-bahdanau": lstm_configs(sizes.recurrent())["lstm-bahdanau"]}  # fmt: skip
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
        seconds = interleaved(runs, device, sizes.repeats, sizes.warmup, sizes.budget_s)
    rate = {name: src.size(0) / s for name, s in seconds.items()}
    common = {"batch": src.size(0), "max_len": sizes.length, "beam_size": beam_size}
    return [
        Figure(f"d_{search}", f"{search} decoding, Transformer, sentences/s", rate[f"transformer_{search}"],
               "sentences/s", detail={**{k: v for k, v in rate.items() if k.endswith(search)}, **common})
        for search in ("greedy", "beam")
    ]  # fmt: skip
