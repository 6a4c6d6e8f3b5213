"""Per-layer diagnostics over what a Transformer returns: attention weights (`forward(..., need_weights=True)`)
and hidden states (`Transformer.hidden_states`). Plain functions of tensors, so any model's outputs work.

- Attention entropy per head: how spread out each head's attention is (0 = one key, log S = uniform).
- Rank collapse (Dong et al. 2021, "Attention is not all you need: pure attention loses rank doubly
  exponentially with depth"): res(X) = X - 1 xᵀ, the distance of a layer's output from the nearest
  rank-1 matrix of the form 1 xᵀ (every token the same vector), relative to ||X||. We use the Frobenius
  norm, whose minimiser x is the mean token, where the paper uses the composite l1,inf norm (no closed
  form); both are 0 exactly when all tokens are equal.
"""

from __future__ import annotations

import torch


def attention_entropy(weights: torch.Tensor, query_mask: torch.Tensor | None = None) -> torch.Tensor:
    """weights (B, H, T, S), rows summing to 1 -> mean entropy per head (H,) in nats over the queries
    where query_mask (B, T) is True (padding queries would otherwise count)."""
    entropy = torch.special.entr(weights).sum(-1)  # (B, H, T); entr(0) = 0 for masked keys
    if query_mask is None:
        return entropy.mean((0, 2))
    mask = query_mask[:, None, :].to(entropy.dtype)  # (B, 1, T)
    return (entropy * mask).sum((0, 2)) / mask.sum((0, 2))


def rank_collapse(hidden: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """hidden (B, L, D) -> ||X - 1 x̄ᵀ||_F / ||X||_F per sequence (B,), over the tokens where mask (B, L)
    is True; x̄ is the mean real token. 0 means every token has collapsed to the same vector."""
    if mask is None:
        mask = torch.ones(hidden.shape[:2], dtype=torch.bool, device=hidden.device)
    m = mask[..., None].to(hidden.dtype)  # (B, L, 1)
    x = hidden * m
    mean = x.sum(1, keepdim=True) / m.sum(1, keepdim=True)  # (B, 1, D)
    residual = (x - mean) * m
    return residual.flatten(1).norm(dim=1) / x.flatten(1).norm(dim=1)


def layer_diagnostics(
    weights: dict[str, list[torch.Tensor | None]],
    hidden: dict[str, list[torch.Tensor]],
    src_mask: torch.Tensor,
    tgt_mask: torch.Tensor,
) -> dict[str, torch.Tensor]:
    """Both measures for every layer of an encoder-decoder: 'entropy/encoder' | 'entropy/decoder' |
    'entropy/cross' as (layers, H), 'rank_collapse/encoder' | 'rank_collapse/decoder' as (layers,)
    averaged over the batch. src_mask (B, S) / tgt_mask (B, T): True for real tokens."""
    queries = {"encoder": src_mask, "decoder": tgt_mask, "cross": tgt_mask}
    out = {
        f"entropy/{kind}": torch.stack([attention_entropy(w, queries[kind]) for w in layers])
        for kind, layers in weights.items()
        if layers and all(w is not None for w in layers)
    }
    for side, states in hidden.items():
        if states:  # a decoder-only model (cross_attention: false) has no encoder layers
            out[f"rank_collapse/{side}"] = torch.stack(
                [rank_collapse(h, queries[side]).mean() for h in states]
            )
    return out
