"""Decoding over the incremental interface every model family has:
`init_state(src) -> dict of batch-first tensors` and `step(state, prev (B,)) -> (logits (B, V), state)`.

Both searches return (B, L) token ids without BOS, EOS kept, padded with pad_id."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Steps between checks that every sequence has ended: each check is a device-to-host sync.
SYNC_EVERY = 4


def generation_budget(
    longest_source: int, longest_target: int = 0, ratio: float = 2.0, extra: int = 10
) -> int:
    """Longest output worth generating: `ratio` times the longer of the longest source and training target
    (outputs can be far longer than inputs: SCAN maps 9 words to 48 actions), plus `extra`."""
    return int(max(longest_source, longest_target) * ratio) + extra


def max_target_length(src: torch.Tensor, pad_id: int, longest_target: int = 0, per_position: int = 1) -> int:
    """The generation budget of a batch of sources (B, S); per_position: source tokens a position of the
    output stands against (an image's: a column of IMAGE_ROWS pixels)."""
    return generation_budget(int((src != pad_id).sum(1).max().item()) // per_position, longest_target)


def length_penalty(length: int, alpha: float) -> float:
    """Wu et al. 2016 (GNMT): ((5 + |Y|) / 6) ** alpha; alpha = 0 ranks by raw log-probability."""
    return ((5.0 + length) / 6.0) ** alpha


def next_token_log_probs(logits: torch.Tensor, pad_id: int, bos_id: int) -> torch.Tensor:
    """(B, V) logits -> float32 log-probabilities (even under autocast) with PAD and BOS ruled out:
    neither is ever a correct next token, and an untrained model would otherwise emit them."""
    log_probs = logits.float().log_softmax(-1)
    log_probs[:, [pad_id, bos_id]] = float("-inf")
    return log_probs


def reorder_state(state: dict[str, torch.Tensor], index: torch.Tensor) -> dict[str, torch.Tensor]:
    """Picks rows of every batch-first state tensor: beams follow their parents."""
    return {name: tensor.index_select(0, index) for name, tensor in state.items()}


@torch.no_grad()
def greedy_decode(
    model: nn.Module, src: torch.Tensor, bos_id: int, eos_id: int, pad_id: int, max_len: int | None = None
) -> torch.Tensor:
    """Batched greedy search."""
    max_len = max_len or max_target_length(src, pad_id)
    state = model.init_state(src)
    prev = torch.full((src.size(0),), bos_id, dtype=torch.long, device=src.device)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
    out = []
    for t in range(max_len):
        logits, state = model.step(state, prev)
        prev = next_token_log_probs(logits, pad_id, bos_id).argmax(-1).masked_fill(finished, pad_id)
        out.append(prev)
        finished |= prev == eos_id
        if (t + 1) % SYNC_EVERY == 0 and finished.all():
            break
    return trim_padding(torch.stack(out, dim=1), pad_id)


def trim_padding(tokens: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Drops trailing columns that are padding in every row (steps taken after all sequences ended)."""
    length = int((tokens != pad_id).sum(1).max().item())
    return tokens[:, : max(length, 1)]


def _merge_pool(
    pool_scores: torch.Tensor, pool_tokens: torch.Tensor, new_scores: torch.Tensor, new_tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keeps the best `k` finished hypotheses per sentence. scores (B, k) / (B, n), tokens (B, k|n, max_len)."""
    scores = torch.cat([pool_scores, new_scores], dim=1)
    tokens = torch.cat([pool_tokens, new_tokens], dim=1)
    best_scores, best = scores.topk(pool_scores.size(1), dim=1)
    return best_scores, tokens.gather(1, best[..., None].expand(-1, -1, tokens.size(2)))


@torch.no_grad()
def beam_search(
    model: nn.Module,
    src: torch.Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    beam_size: int = 4,
    alpha: float = 0.6,
    max_len: int | None = None,
) -> torch.Tensor:
    """Batched beam search: all B * k hypotheses advance in one `step` call. Of the 2k best extensions of
    the k live hypotheses, one ending in EOS within the top k joins the sentence's pool of finished ones,
    scored by log-probability / length_penalty(length, alpha); the best k that did not end stay alive. A
    sentence is done once k have finished (so k = 1 is exactly greedy); at max_len the live ones join the
    pool. Returns the pool's best."""
    b, k = src.size(0), beam_size
    max_len = max_len or max_target_length(src, pad_id)
    device = src.device
    state = reorder_state(model.init_state(src), torch.arange(b, device=device).repeat_interleave(k))
    # Only the first beam starts alive, so step one does not fill the beam with copies of one token.
    scores = torch.full((b, k), float("-inf"), device=device)
    scores[:, 0] = 0.0
    tokens = src.new_empty((b, k, 0))
    pool_scores = torch.full((b, k), float("-inf"), device=device)
    pool_tokens = src.new_full((b, k, max_len), pad_id)
    n_finished = torch.zeros(b, dtype=torch.long, device=device)
    top_k = torch.arange(2 * k, device=device) < k
    parent_offset = torch.arange(b, device=device)[:, None] * k
    prev = src.new_full((b * k,), bos_id)
    for t in range(max_len):
        logits, state = model.step(state, prev)
        log_probs = next_token_log_probs(logits, pad_id, bos_id)  # (B*k, V)
        cand_scores, parent, token, cand_tokens = _extensions(scores, tokens, log_probs)

        ends = token == eos_id
        to_pool = ends & top_k & (n_finished < k)[:, None] & cand_scores.isfinite()
        pool_scores, pool_tokens = _merge_pool(
            pool_scores, pool_tokens,
            (cand_scores / length_penalty(t + 1, alpha)).masked_fill(~to_pool, float("-inf")),
            F.pad(cand_tokens, (0, max_len - t - 1), value=pad_id),
        )  # fmt: skip
        n_finished += to_pool.sum(1)

        # At most k of the 2k candidates end in EOS (one per parent), so k always remain to continue.
        scores, keep = cand_scores.masked_fill(ends, float("-inf")).topk(k, dim=1)
        tokens = cand_tokens.gather(1, keep[..., None].expand(-1, -1, t + 1))
        state = reorder_state(state, (parent.gather(1, keep) + parent_offset).flatten())
        prev = tokens[..., -1].flatten()
        if (t + 1) % SYNC_EVERY == 0 and (n_finished >= k).all():
            break

    return _best(pool_scores, pool_tokens, scores, tokens, n_finished < k, alpha, pad_id)


def _best(
    pool_scores: torch.Tensor, pool_tokens: torch.Tensor, scores: torch.Tensor, tokens: torch.Tensor,
    open_sentence: torch.Tensor, alpha: float, pad_id: int,
) -> torch.Tensor:  # fmt: skip
    """Each sentence's best hypothesis (B, T), trimmed: the pool's best, where a sentence that reached
    max_len without k finished hypotheses (`open_sentence`, (B,)) lets its live ones compete."""
    live_scores = (scores / length_penalty(tokens.size(2), alpha)).masked_fill(~open_sentence[:, None], float("-inf"))
    pad = (0, pool_tokens.size(2) - tokens.size(2))
    pool_scores, pool_tokens = _merge_pool(pool_scores, pool_tokens, live_scores, F.pad(tokens, pad, value=pad_id))
    best = pool_tokens[torch.arange(pool_tokens.size(0), device=pool_tokens.device), pool_scores.argmax(1)]
    return trim_padding(best, pad_id)


def _extensions(
    scores: torch.Tensor, tokens: torch.Tensor, log_probs: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The 2k best one-token extensions of each sentence's k hypotheses (`scores` (B, k), `tokens`
    (B, k, t), `log_probs` (B*k, V)), best first: their scores, parent beams and new tokens, each (B, 2k),
    and their tokens (B, 2k, t+1)."""
    b, k = scores.shape
    vocab = log_probs.size(-1)
    candidates = (scores[..., None] + log_probs.view(b, k, vocab)).view(b, k * vocab)
    cand_scores, cand_index = candidates.topk(2 * k, dim=1)
    parent, token = cand_index // vocab, cand_index % vocab
    history = tokens.gather(1, parent[..., None].expand(-1, -1, tokens.size(2)))
    return cand_scores, parent, token, torch.cat([history, token[..., None]], dim=2)
