"""Positional encodings against their definitions: the lectures' sinusoid table, RoPE's relative
property, ALiBi's slopes, and what each does past the positions it was built or trained for."""

import math

import pytest
import torch

from models.config import ModelConfig
from models.positional_layers import ALiBi, LearnedEncoding, Rotary, SinusoidalEncoding, sinusoidal_table
from models.transformer import Transformer


def test_sinusoidal_table_matches_the_lectures():
    # d = 4, n = 100: PE(p, 2i) = sin(p / n^(2i/d)), PE(p, 2i+1) = cos(p / n^(2i/d)).
    expected = torch.tensor(
        [[0, 1, 0, 1], [0.84, 0.54, 0.10, 1.00], [0.91, -0.42, 0.20, 0.98], [0.14, -0.99, 0.30, 0.96]]
    )
    table = sinusoidal_table(4, 4, base=100.0)
    torch.testing.assert_close(table.round(decimals=2), expected)


def test_pos_base_reaches_the_model_table():
    model = Transformer(ModelConfig(d_model=4, heads=2, pos_base=100.0), 8, 8)
    torch.testing.assert_close(model.positions.embedding.table[:4], sinusoidal_table(4, 4, base=100.0))


def test_sinusoidal_odd_dimension_and_growth_past_the_table():
    table = sinusoidal_table(6, 5)
    assert table.shape == (6, 5)
    torch.testing.assert_close(table[3, 4], torch.tensor(math.sin(3 / 10000 ** (4 / 5))))
    encoding = SinusoidalEncoding(8, max_positions=4)
    x = torch.zeros(2, 10, 8)
    torch.testing.assert_close(encoding(x), sinusoidal_table(10, 8).expand(2, 10, 8))


@pytest.mark.parametrize("make", [lambda: SinusoidalEncoding(8, 16), lambda: LearnedEncoding(8, 16)])
def test_offset_gives_the_same_positions_as_the_full_sequence(make):
    encoding = make()
    x = torch.randn(2, 7, 8)
    torch.testing.assert_close(encoding(x[:, 4:], offset=4), encoding(x)[:, 4:])


def test_learned_positions_past_training_lengths_but_inside_the_table_work():
    encoding = LearnedEncoding(8, max_positions=16)
    out = encoding(torch.zeros(1, 16, 8))
    torch.testing.assert_close(out[0], encoding.embedding.weight)


def test_learned_positions_past_max_positions_fail_naming_the_key():
    encoding = LearnedEncoding(8, max_positions=16)
    with pytest.raises(ValueError, match=r"model\.max_positions: .*16 positions.*position 17"):
        encoding(torch.zeros(1, 17, 8))
    with pytest.raises(ValueError, match=r"model\.max_positions"):
        encoding(torch.zeros(1, 1, 8), offset=16)
    model = Transformer(ModelConfig(d_model=8, heads=2, pos_encoding="learned", max_positions=6), 9, 9)
    with pytest.raises(ValueError, match=r"model\.max_positions"):
        model(torch.randint(4, 9, (1, 7)), torch.randint(4, 9, (1, 3)))


def test_rope_scores_depend_only_on_relative_position():
    rotary = Rotary(head_dim=8, base=100.0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> torch.Tensor:
        return (rotary(q, offset=m) * rotary(k, offset=n)).sum()

    torch.testing.assert_close(score(5, 2), score(3, 0))
    torch.testing.assert_close(score(40, 41), score(0, 1))
    assert not torch.allclose(score(5, 2), score(5, 3))
    # A rotation: norms are kept, and position 0 is the identity.
    x = torch.randn(2, 3, 6, 8)
    torch.testing.assert_close(rotary(x).norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rotary(x)[:, :, 0], x[:, :, 0])
    torch.testing.assert_close(rotary(x[:, :, 2:], offset=2), rotary(x)[:, :, 2:])


def test_rope_rotates_pair_i_with_i_plus_half_by_position_times_theta():
    rotary = Rotary(head_dim=4, base=100.0)
    x = torch.tensor([1.0, 0.0, 0.0, 0.0]).view(1, 1, 1, 4)
    out = rotary(x, offset=3)[0, 0, 0]
    # Pair (x_0, x_2) turns by 3 * theta_0 = 3 rad.
    torch.testing.assert_close(out, torch.tensor([math.cos(3.0), 0.0, math.sin(3.0), 0.0]))


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(ALiBi.slopes_for(8), torch.tensor([2.0**-i for i in range(1, 9)]))
    torch.testing.assert_close(ALiBi.slopes_for(4), torch.tensor([2.0**-i for i in (2, 4, 6, 8)]))
    # Not a power of two: the 4-head slopes, then every other slope of the 8-head set.
    torch.testing.assert_close(ALiBi.slopes_for(6), torch.tensor([2.0**-i for i in (2, 4, 6, 8, 1, 3)]))


def test_alibi_bias_is_minus_slope_times_distance_with_queries_last():
    alibi = ALiBi(2)
    bias = alibi(4, 4)
    i, j = torch.arange(4)[:, None], torch.arange(4)[None, :]
    torch.testing.assert_close(bias[0], -(2.0**-4) * (i - j).abs().float())  # 2 heads: 2^-4, 2^-8
    # One query after three cached keys is position 3: the last row of the full bias.
    torch.testing.assert_close(alibi(1, 4), bias[:, 3:])
