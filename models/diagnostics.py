"""Diagnostics of a Transformer, as plain functions of tensors: rank collapse of a layer's outputs
(`Transformer.record_states`), and what a model looks like at initialisation (`at_initialisation`).

Rank collapse (Dong et al. 2021, "Attention is not all you need: pure attention loses rank doubly
exponentially with depth"): res(X) = X - 1 xᵀ, the distance from the nearest rank-1 matrix 1 xᵀ (every
token the same vector), relative to ||X||. The Frobenius norm, whose minimiser x is the mean token, stands
in for the paper's composite l1,inf norm (no closed form); both are 0 exactly when all tokens are equal.

At initialisation, on the first training batch, in eval mode (no dropout), the two mechanisms papers give
for an ablation's effect: Xiong et al. 2020 (abstract): at initialisation post-LN's gradients near the
output are large and pre-LN's well-behaved, which is why post-LN needs warmup (measured here in the last
decoder layer's feed-forward output weight W², and against the first layer's); Vaswani et al. 2017 (Sec.
3.2.1 and its footnote 4): without 1/sqrt(d_k) the dot products grow with d_k and push the softmax towards
one key, where its gradients vanish, seen as attention of low entropy.
"""

from __future__ import annotations

import math

import torch

from ablate.models.attention import build_mask
from ablate.models.sequences import PAD_ID
from ablate.models.steps import token_cross_entropy


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


def attention_entropy(weights: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """weights (B, H, T, S), visible (B, T, S): True where the masks let query t see key s -> the entropy of
    each query's weights relative to uniform over the n keys it sees, -Σ w log w / log n, for every head and
    every query that sees two keys or more (flat): 1 for uniform weights, 0 for all weight on one key. n comes
    from the masks, not from the weights, which a saturated softmax rounds to 0 off its key."""
    n = visible.sum(-1)  # (B, T)
    w = weights.double()
    plogp = torch.where(w > 0, w * w.clamp_min(1e-300).log(), 0.0)  # 0 log 0 = 0
    h = -plogp.sum(-1) / n.clamp_min(2).double().log()[:, None]  # (B, H, T)
    return h[(n >= 2)[:, None].expand_as(h)]


def visible_keys(src: torch.Tensor, tgt_in: torch.Tensor, causal: bool) -> dict[str, torch.Tensor]:
    """Which keys each real query of each attention kind may see, (B, T, S): the attention's own mask
    (models/attention.py build_mask) on its real queries. A padded query sees none (the loss reads no padded
    position, and a batch padded further, as a compiled step's is, measures the same)."""
    src_real, tgt_real = src != PAD_ID, tgt_in != PAD_ID  # (B, S), (B, T)

    def seen(queries: torch.Tensor, keys: torch.Tensor, causal: bool = False) -> torch.Tensor:
        mask = build_mask(keys, queries.size(1), keys.size(1), causal, keys.device)[:, 0]  # (B, T, S)
        return queries[:, :, None] & mask

    return {"encoder": seen(src_real, src_real), "decoder": seen(tgt_real, tgt_real, causal),
            "cross": seen(tgt_real, src_real)}  # fmt: skip


def at_initialisation(model, batch: dict[str, torch.Tensor], label_smoothing: float) -> dict[str, float]:
    """A Transformer (models/transformer.py) before its first step, on one batch in eval mode: grad_last, the
    Frobenius norm of the gradient of the training loss in the last decoder layer's feed-forward output
    weight W²; grad_growth, that over the first decoder layer's (1 where every layer's is the same);
    attn_entropy, the mean attention_entropy over every attention layer, kind, head and query. The gradient
    metrics need the feed-forward sublayers (model.ffn). The model's weights, gradients, mode and the random
    streams are left as they were."""
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            logits, weights = model(batch["src"], batch["tgt_in"], need_weights=True)
            loss = token_cross_entropy(logits, batch["tgt_out"], label_smoothing)
            ffn = [layer.ff.fn.net[-1].weight for layer in model.decoder] if model.cfg.ffn else []
            grads = torch.autograd.grad(loss, ffn) if ffn else []
    finally:
        model.train(was_training)
    visible = visible_keys(batch["src"], batch["tgt_in"], model.cfg.causal_mask)
    entropies = [
        attention_entropy(w.detach(), visible[kind]) for kind, layers in weights.items() for w in layers
        if w is not None
    ]  # fmt: skip
    out = {"attn_entropy": float(torch.cat(entropies).mean())} if entropies else {}
    if grads:
        first, last = (float(g.norm()) for g in (grads[0], grads[-1]))
        out.update(grad_last=last, grad_growth=last / first if first > 0 else math.nan)
    return out
