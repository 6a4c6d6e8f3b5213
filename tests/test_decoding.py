"""Greedy and beam search over the init_state / step interface."""

import pytest
import torch
from torch import nn

from ablate.models import ModelConfig, build_model
from ablate.models.decoding import (
    beam_search,
    generation_budget,
    greedy_decode,
    length_penalty,
    max_target_length,
)

pytestmark = pytest.mark.usefixtures("single_thread")

PAD, BOS, EOS, A, B, C = range(6)


class TableModel(nn.Module):
    """A decoder whose next-token distribution depends only on the previous token: probabilities
    table[prev] over the 6 tokens (a row not given ends with EOS). Sequence scores are known exactly."""

    def __init__(self, table: dict[int, dict[int, float]]):
        super().__init__()
        probs = torch.zeros(6, 6)
        for prev in range(6):
            for token, p in table.get(prev, {EOS: 1.0}).items():
                probs[prev, token] = p
        self.register_buffer("log_probs", probs.log())

    def init_state(self, src: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"row": torch.arange(src.size(0))}  # lets the test see that beams follow their parents

    def step(self, state, prev):
        return self.log_probs[prev], state


def until_eos(row: list[int]) -> list[int]:
    return row[: row.index(EOS) + 1] if EOS in row else row


# Greedy takes A (0.6), then the best of three near-equal options, ending with 0.6 * 0.4 = 0.24;
# B then EOS has 0.4: only a search that keeps the second-best first token finds it.
GARDEN_PATH = {BOS: {A: 0.6, B: 0.4}, A: {C: 0.4, A: 0.3, B: 0.3}, B: {EOS: 1.0}}


def test_beam_search_finds_a_better_sequence_than_greedy():
    model = TableModel(GARDEN_PATH)
    src = torch.full((3, 4), A)
    greedy = greedy_decode(model, src, BOS, EOS, PAD, max_len=6)
    beam = beam_search(model, src, BOS, EOS, PAD, beam_size=2, alpha=0.0, max_len=6)
    assert greedy.tolist() == [[A, C, EOS]] * 3
    assert beam.tolist() == [[B, EOS]] * 3


def test_length_penalty_decides_between_short_and_long():
    # [EOS] has p = 0.5; [A, EOS] has 0.45: raw log-probability prefers the short one, while
    # alpha = 2 divides the longer one's log-probability by ((5 + 2) / 6)^2 = 1.36 and prefers it.
    model = TableModel({BOS: {EOS: 0.5, A: 0.5}, A: {EOS: 0.9, A: 0.1}})
    src = torch.full((1, 3), A)
    assert beam_search(model, src, BOS, EOS, PAD, beam_size=2, alpha=0.0, max_len=5).tolist() == [[EOS]]
    assert beam_search(model, src, BOS, EOS, PAD, beam_size=2, alpha=2.0, max_len=5).tolist() == [[A, EOS]]


def test_beam_output_ends_at_eos_and_is_trimmed():
    model = TableModel(GARDEN_PATH)
    out = beam_search(model, torch.full((2, 3), A), BOS, EOS, PAD, beam_size=3, alpha=0.6, max_len=8)
    # alpha = 0.6: [B, EOS] scores log 0.4 / (7/6)^0.6 = -0.835, [A, C, EOS] log 0.24 / (8/6)^0.6 = -1.201;
    # the output stops at the longest row's EOS instead of running on to max_len.
    assert out.tolist() == [[B, EOS]] * 2


def test_sequences_that_never_end_stop_at_max_len():
    model = TableModel({BOS: {A: 1.0}, A: {A: 0.9, B: 0.1}, B: {A: 1.0}})
    src = torch.full((2, 3), A)
    assert beam_search(model, src, BOS, EOS, PAD, beam_size=3, max_len=7).tolist() == [[A] * 7] * 2
    assert greedy_decode(model, src, BOS, EOS, PAD, max_len=7).tolist() == [[A] * 7] * 2


def test_max_target_length_follows_the_longest_source():
    src = torch.tensor([[4, 5, 2, 0, 0], [4, 5, 6, 7, 2]])
    assert max_target_length(src, PAD) == 2 * 5 + 10
    untrained = TableModel({BOS: {A: 1.0}, A: {A: 1.0}})
    assert greedy_decode(untrained, src, BOS, EOS, PAD).tolist() == [[A] * 20] * 2
    # Targets longer than their sources (SCAN: 9 words, 48 actions) raise the budget.
    assert max_target_length(src, PAD, longest_target=48) == 2 * 48 + 10


def random_model(arch: str) -> nn.Module:
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, d_model=16, layers=2, heads=2, d_ff=32, dropout=0.0,
                      attention="additive" if arch == "lstm" else "none")  # fmt: skip
    return build_model(cfg, 9, 9, PAD).eval()


def padded_sources() -> torch.Tensor:
    torch.manual_seed(1)
    src = torch.randint(4, 9, (6, 7))
    for i, length in enumerate([7, 3, 5, 1, 6, 2]):
        src[i, length - 1] = EOS
        src[i, length:] = PAD
    return src


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_beam_size_one_is_greedy(arch):
    model, src = random_model(arch), padded_sources()
    greedy = greedy_decode(model, src, BOS, EOS, PAD, max_len=12)
    assert torch.equal(beam_search(model, src, BOS, EOS, PAD, beam_size=1, max_len=12), greedy)


@pytest.mark.parametrize("arch", ["transformer", "lstm"])
def test_batched_beam_search_matches_one_sentence_at_a_time(arch):
    # Reordering beams in a batch must not mix sentences: each row decodes as it would alone.
    model, src = random_model(arch), padded_sources()
    batched = beam_search(model, src, BOS, EOS, PAD, beam_size=3, max_len=12)
    for i in range(src.size(0)):
        length = int((src[i] != PAD).sum())
        alone = beam_search(model, src[i : i + 1, :length], BOS, EOS, PAD, beam_size=3, max_len=12)
        assert until_eos(batched[i].tolist()) == until_eos(alone[0].tolist())


def test_decoders_never_emit_padding_or_bos():
    # An untrained model puts mass everywhere; generated sequences must still be well formed.
    model = TableModel({BOS: {PAD: 0.5, BOS: 0.3, A: 0.2}, A: {PAD: 0.6, EOS: 0.4}})
    src = torch.full((1, 2), A)
    assert greedy_decode(model, src, BOS, EOS, PAD, max_len=4).tolist() == [[A, EOS]]
    assert beam_search(model, src, BOS, EOS, PAD, beam_size=2, max_len=4).tolist() == [[A, EOS]]


def test_gnmt_length_penalty_values():
    # ((5 + |Y|) / 6) ** alpha: 1 for a one-token output whatever alpha, sqrt(2) for seven tokens at 0.5.
    assert length_penalty(1, 0.6) == 1.0
    assert length_penalty(7, 0.5) == pytest.approx(2**0.5, rel=1e-12)
    assert length_penalty(13, 2.0) == pytest.approx(9.0, rel=1e-12)
    assert length_penalty(40, 0.0) == 1.0


def test_an_all_padding_batch_still_gets_the_extra_steps():
    # 2 * max(0 source tokens, 0 target tokens) + 10.
    assert generation_budget(0) == 10
    assert max_target_length(torch.full((2, 3), PAD), PAD) == 10
