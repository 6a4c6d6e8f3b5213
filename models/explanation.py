"""Whether a classifier's attention explains its decisions: the measures of Jain & Wallace 2019 ("Attention is
not Explanation") on a batch of texts, per example.

- importance: gradient times input at each token, |(dy/de_t) . e_t| for the predicted label's probability y
  and the token's embedding e_t (the gradient at a one-hot input's active entry), normalised to sum 1;
- tau_grad, tau_loo: Kendall's tau-b between the attention weights and the gradient importance, and between
  them and leave-one-out importance (the total variation distance between the output with and without the
  token);
- perm_tvd: the median, over PERMUTATIONS shuffles of the attention weights among the text's tokens, of the
  output's total variation distance from the model's own;
- adv_jsd: the largest Jensen-Shannon divergence (base 2: 0 to 1) from the model's attention that an
  adversarial attention reached in ADVERSARY_STEPS steps of Adam while the output stayed within TVD_BOUND
  of the model's own (0 when none did).
Every measure reads the text's real tokens (EOS included), the attention averaged over heads; a text of one
token has none (NaN). The model is not changed: no parameter gets a gradient, and its mode is kept.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import kendalltau
from torch import nn

from ablate.models.decoding import next_token_log_probs
from ablate.models.sequences import BOS_ID

PERMUTATIONS = 20
ADVERSARY_STEPS = 50
ADVERSARY_LR = 0.5
TVD_BOUND = 0.01  # "a small total variation distance": the output may move by at most this
PENALTY = 100.0  # on each unit of TVD past the bound, against the divergence gained
LOO_ROWS = 2048  # texts per forward pass of the leave-one-out variants
MEASURES = ("tau_grad", "tau_loo", "perm_tvd", "adv_jsd")


def tvd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Total variation distance between distributions on the last axis."""
    return 0.5 * (p - q).abs().sum(-1)


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence in bits (0 to 1) between distributions on the last axis; 0·log 0 = 0."""
    m = 0.5 * (p + q)

    def kl(a: torch.Tensor) -> torch.Tensor:
        return torch.where(a > 0, a * (a.clamp_min(1e-30) / m.clamp_min(1e-30)).log2(), 0.0).sum(-1)

    return 0.5 * (kl(p) + kl(q))


def gradient_importance(model: nn.Module, src: torch.Tensor) -> torch.Tensor:
    """|(dy/de_t) . e_t| (B, S) for y the predicted label's probability, 0 at padding, each row summing to 1."""
    captured = []
    hook = model.embedding.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        # cuDNN's RNN has no backward in eval mode; the native kernel computes the same
        with torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
            probs = model.logits(src)[0].float().softmax(-1)
            label = next_token_log_probs(probs.detach().log(), model.pad_id, BOS_ID).argmax(-1)  # as decoded
            (grad,) = torch.autograd.grad(probs.gather(1, label[:, None]).sum(), captured[0])
    finally:
        hook.remove()
    scores = (grad * captured[0]).sum(-1).abs().detach().float() * (src != model.pad_id)
    return scores / scores.sum(-1, keepdim=True).clamp_min(1e-30)


def leave_one_out(model: nn.Module, src: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """TVD (B, S) between each text's output and its output without token t (NaN past its real tokens)."""
    b, s = src.shape
    lengths = (src != model.pad_id).sum(1)
    # Row t of `keep` lists the positions of a text without t, padded at the end: (S, S) into (B, S + 1).
    positions = torch.arange(s, device=src.device)
    keep = positions[None] + (positions[None] >= positions[:, None]).long()
    padded = torch.cat([src, src.new_full((b, 1), model.pad_id)], dim=1)
    variants = padded[:, keep].reshape(b * s, s)  # (B·S, S): text b without token t at row b·S + t
    real = (positions[None] < lengths[:, None]).reshape(-1) & (lengths >= 2).repeat_interleave(s)
    out = torch.full((b * s,), float("nan"), device=src.device)
    rows = real.nonzero()[:, 0]
    for chunk in rows.split(LOO_ROWS):
        chunk_probs = model.logits(variants[chunk])[0].float().softmax(-1)
        out[chunk] = tvd(chunk_probs, probs.repeat_interleave(s, 0)[chunk])
    return out.view(b, s)


def text_draws(src: torch.Tensor, pad_id: int, shape: tuple[int, ...], normal: bool = False) -> torch.Tensor:
    """Random numbers (B, *shape, S) drawn for each text from a generator seeded by its own tokens, on the CPU:
    the same for a text whatever its batch, its row, its padding or the device. A text's entries past its
    length are padding's (not drawn)."""
    rows = []
    for text in src.cpu():
        real = text[text != pad_id]
        g = torch.Generator().manual_seed(zlib.crc32(real.numpy().astype(np.int64).tobytes()))
        draw = torch.randn if normal else torch.rand
        rows.append(F.pad(draw(*shape, len(real), generator=g), (0, src.size(1) - len(real))))
    return torch.stack(rows).to(src.device)


def permuted(model, src, states, weights, padding, probs) -> torch.Tensor:
    """The median TVD (B,) of the output under PERMUTATIONS shuffles of each text's weights among its tokens
    (the midpoint of the middle two: the shuffles are even in number)."""
    # Each row's real positions in a random order, padding kept last: sort random keys, padding's above 1.
    keys = text_draws(src, model.pad_id, (PERMUTATIONS,)).masked_fill(~padding[:, None], 2.0)  # (B, P, S)
    changes = []
    for order in keys.argsort(-1).unbind(1):  # (B, S) each
        shuffled = weights.gather(-1, order[:, None, None].expand_as(weights))
        changes.append(tvd(model.classify(states, shuffled).float().softmax(-1), probs))
    median = torch.quantile(torch.stack(changes), 0.5, dim=0)
    return median.masked_fill(padding.sum(1) < 2, float("nan"))


def adversarial(model, src, states, weights, padding, probs) -> torch.Tensor:
    """The largest JSD (B,) from `weights` (averaged over heads) that attention reached while the output
    stayed within TVD_BOUND, searching each head's distribution by Adam on its logits from the model's own
    plus a little noise drawn for each text (text_draws)."""
    states, weights = states.detach(), weights.detach().float()
    mask = padding[:, None, None]  # (B, 1, 1, S)
    logits = weights.clamp_min(1e-6).log().masked_fill(~mask, float("-inf"))
    noise = text_draws(src, model.pad_id, (weights.size(1), 1), normal=True)  # (B, H, 1, S)
    logits = logits + 0.01 * noise.masked_fill(~mask, 0.0)
    logits.requires_grad_(True)
    optimiser = torch.optim.Adam([logits], lr=ADVERSARY_LR)
    best = torch.zeros(weights.size(0), device=weights.device)
    for _ in range(ADVERSARY_STEPS):
        with torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
            candidate = logits.softmax(-1)
            divergence = jsd(candidate.mean(1)[:, 0], weights.mean(1)[:, 0])  # (B,)
            change = tvd(model.classify(states, candidate.to(states.dtype)).float().softmax(-1), probs)
            feasible = change <= TVD_BOUND
            best = torch.where(feasible, torch.maximum(best, divergence.detach()), best)
            loss = (-divergence + PENALTY * (change - TVD_BOUND).clamp_min(0)).sum()
            (grad,) = torch.autograd.grad(loss, logits)
        logits.grad = grad.nan_to_num(0.0)
        optimiser.step()
    return best.masked_fill(padding.sum(1) < 2, float("nan"))


def kendall(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b of two rankings; NaN where either is constant or shorter than 2."""
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(kendalltau(a, b).statistic)


def explain(model: nn.Module, src: torch.Tensor) -> dict[str, torch.Tensor]:
    """{'importance': (B, S)} for any classifier; with attention pooling also each of MEASURES, (B,). The
    shuffles and the adversary's start are drawn per text from its tokens (text_draws), so that the measures
    depend on the model and the texts alone: not on the global generator (which differs between a seed
    trained alone and fused), nor on a text's batch."""
    with torch.no_grad():
        states, padding, _, _ = model.encode(src)
        weights = model.pool_weights(states, padding)
        probs = (model.classify(states, weights) if weights is not None else model.logits(src)[0]).float()
        probs = probs.softmax(-1)
    importance = gradient_importance(model, src)
    out = {"importance": importance}
    if model.cfg.pooling != "attention":
        return out
    with torch.no_grad():
        out["perm_tvd"] = permuted(model, src, states, weights, padding, probs)
        loo = leave_one_out(model, src, probs)
    out["adv_jsd"] = adversarial(model, src, states, weights, padding, probs)
    attention = weights.float().mean(1)[:, 0].cpu().numpy()  # (B, S)
    lengths = padding.sum(1).tolist()
    for name, other in (("tau_grad", importance), ("tau_loo", loo)):
        other = other.cpu().numpy()
        out[name] = torch.tensor([kendall(attention[i, :n], other[i, :n]) for i, n in enumerate(lengths)])
    return out
