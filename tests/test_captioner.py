"""The captioner family (models/captioner.py) and its task, strips of handwritten digits
(harness/tasks/digits.py): the strip's pixels and gold alignment against a hand-drawn strip; the regions
against a hand fold of the image; the pixel weights and the doubly stochastic penalty against their
formulas; alignment error with possible links; the figure; learning; the refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import fit
from matplotlib.patches import Rectangle

from ablate.harness.artifacts import AttentionSample
from ablate.harness.attention_maps import probe_aer, probe_figure
from ablate.harness.metrics import alignment_error_rate
from ablate.harness.probes import CELL, GOLD, heatmap
from ablate.harness.tasks import build_task
from ablate.harness.tasks.datamodule import Seq2SeqDataModule
from ablate.harness.tasks.digits import image_pools, load_images, strip_example
from ablate.models import build_model
from ablate.models.config import ModelConfig
from ablate.models.decoding import max_target_length
from ablate.models.rnn import RNNSeq2Seq
from ablate.models.sequences import EOS_ID, IMAGE_ROWS, PAD_ID
from ablate.models.steps import token_cross_entropy, training_loss
from ablate.schema.config import load_config
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

pytestmark = pytest.mark.usefixtures("single_thread")

DIGITS_TASK = TaskConfig(
    name="digits", min_len=1, max_len=2, test_max_len=3, n_train=2000, n_valid=50, n_test=200
)


def captioner(**keys) -> ModelConfig:
    return ModelConfig(**{"arch": "captioner", "d_model": 16, "layers": 1, "dropout": 0.0,
                          "attention": "additive", **keys})  # fmt: skip


def test_a_strip_is_its_images_column_by_column_and_each_digit_aligns_to_its_own_image():
    # Two hand-drawn 8 x 8 images: pixel (row r, column c) of image k has level (k * 64 + 8 r + c) % 17.
    images = np.array([[[(k * 64 + 8 * r + c) % 17 for c in range(8)] for r in range(8)] for k in range(2)])
    ex = strip_example(images, np.array([7, 2]))
    assert ex.tgt == ("7", "2") and len(ex.src) == 128 and ex.alignment == ()
    for k in range(2):
        for r in range(8):
            for c in range(8):
                token = (8 * k + c) * IMAGE_ROWS + r  # the strip's column 8k + c, from its top
                assert ex.src[token] == str(images[k, r, c])
    assert ex.possible == tuple((i, 0) for i in range(64)) + tuple((i, 1) for i in range(64, 128))


def test_no_image_is_in_two_splits_and_each_strip_is_drawn_from_its_own():
    images, labels = load_images()
    assert images.shape == (1797, 8, 8) and images.min() == 0 and images.max() == 16
    pools = image_pools(len(images))
    assert sorted(np.concatenate(list(pools.values())).tolist()) == list(range(len(images)))
    data = build_task(DIGITS_TASK, 0)
    for split, pool in (("train", "train"), ("test", "test"), ("test_long", "test")):
        own = {images[i].tobytes() for i in pools[pool]}
        for ex in data.splits[split][:50]:
            strip = np.array([int(t) for t in ex.src]).reshape(-1, IMAGE_ROWS).T  # (8, 8n)
            for k, digit in enumerate(ex.tgt):
                image = strip[:, 8 * k : 8 * (k + 1)].astype(images.dtype)
                assert image.tobytes() in own
                assert any(labels[i] == int(digit) for i in pools[pool] if np.array_equal(images[i], image))
    assert {len(ex.tgt) for ex in data.splits["test_long"]} == {3}
    assert data.src_vocab.itos[4:] == sorted(str(level) for level in range(17))


def batch_of(data, split="test", count=4):
    dm = Seq2SeqDataModule(data, batch_size=count, seed=0, eval_batch_size=count)
    return next(iter(dm.test_dataloader()[["test", "test_long"].index(split)]))


@pytest.fixture(scope="module")
def digits():
    return build_task(DIGITS_TASK, 0)


def test_regions_are_the_image_folded_back_and_do_not_see_the_padding_after_it(digits):
    torch.manual_seed(0)
    model = build_model(captioner(), len(digits.src_vocab), len(digits.tgt_vocab)).eval()
    batch = batch_of(digits)
    src = batch["src"]
    image, pixels = model.encoder.image(src)
    row = 0
    length = int((src[row] != PAD_ID).sum()) - 1  # without EOS
    by_hand = src[row, :length].view(-1, IMAGE_ROWS).T  # column-major tokens, folded
    assert torch.equal(image[row, :, : by_hand.size(1)], by_hand)
    assert (image[row, :, by_hand.size(1) :] == PAD_ID).all() and not pixels[row, length:].any()
    # The same strip alone, and with more padding after it: the same logits.
    alone = model(src[row : row + 1, : length + 1], batch["tgt_in"][row : row + 1])
    padded = torch.nn.functional.pad(src[row : row + 1, : length + 1], (0, 40), value=PAD_ID)
    torch.testing.assert_close(model(padded, batch["tgt_in"][row : row + 1]), alone)
    torch.testing.assert_close(model(src, batch["tgt_in"])[row : row + 1], alone, atol=1e-5, rtol=1e-5)


def region_weights(model, src, tgt_in):
    """The decoder's weights over the regions (B, H, T, R), from the LSTM family's own forward."""
    return RNNSeq2Seq.forward(model, src, tgt_in, need_weights=True)[1]["cross"][0]


def test_pixel_weights_spread_each_regions_weight_over_its_pixels(digits):
    torch.manual_seed(0)
    model = build_model(captioner(attention_heads=2), len(digits.src_vocab), len(digits.tgt_vocab)).eval()
    batch = batch_of(digits)
    src, tgt_in = batch["src"], batch["tgt_in"]
    pixels = model(src, tgt_in, need_weights=True)[1]["cross"][0]  # (B, H, T, S)
    regions = region_weights(model, src, tgt_in)
    assert pixels.shape[:3] == regions.shape[:3] and pixels.size(-1) == src.size(1)
    torch.testing.assert_close(pixels.sum(-1), torch.ones_like(pixels.sum(-1)))
    assert (pixels * ((src == EOS_ID) | (src == PAD_ID))[:, None, None]).abs().max() == 0
    for b in range(src.size(0)):
        for token in range(int((src[b] != PAD_ID).sum()) - 1):
            column, row = divmod(token, IMAGE_ROWS)
            region = (column // 2) * (IMAGE_ROWS // 2) + row // 2  # 2 x 2 pixels, column-major
            torch.testing.assert_close(pixels[b, :, :, token], regions[b, :, :, region] / 4)


def test_the_doubly_stochastic_penalty_is_its_formula_and_joins_the_loss_per_token(digits):
    torch.manual_seed(0)
    lam = 0.7
    model = build_model(captioner(doubly_stochastic=lam, attention_heads=2), len(digits.src_vocab),
                        len(digits.tgt_vocab)).eval()  # fmt: skip
    batch = batch_of(digits)
    src, tgt_in, tgt_out = batch["src"], batch["tgt_in"], batch["tgt_out"]
    alpha = region_weights(model, src, tgt_in).double().mean(1)  # (B, T, R), heads averaged
    expected = []
    for b in range(src.size(0)):
        steps = int((tgt_in[b] != PAD_ID).sum())
        real_pixels = int((src[b] != PAD_ID).sum()) - 1
        regions = (real_pixels // IMAGE_ROWS // 2) * (IMAGE_ROWS // 2)  # whole digits: 16 regions each
        attended = alpha[b, :steps, :regions].sum(0)
        assert alpha[b, :, regions:].abs().max() < 1e-12  # padding gets none
        expected.append(lam * float(((1 - attended) ** 2).sum().detach()))
    logits, penalty = model.penalised(src, tgt_in)
    torch.testing.assert_close(
        penalty.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-6
    )
    tokens = (tgt_out != PAD_ID).sum()
    loss = training_loss(model, src, tgt_in, tgt_out, 0.0)
    torch.testing.assert_close(loss, token_cross_entropy(logits, tgt_out) + penalty.sum() / tokens)
    # Off, or without attention: the cross entropy alone.
    for cfg in (captioner(), captioner(attention="none")):
        plain = build_model(cfg, len(digits.src_vocab), len(digits.tgt_vocab)).eval()
        assert plain.penalised(src, tgt_in)[1] is None
        torch.testing.assert_close(training_loss(plain, src, tgt_in, tgt_out, 0.0),
                                   token_cross_entropy(plain(src, tgt_in), tgt_out))  # fmt: skip


def test_alignment_error_with_possible_links_against_hand_values():
    # Argmax links A = {(0, 0), (2, 1), (3, 2)}; sure S = {(0, 0)}; possible beside it {(1, 1), (2, 1)}.
    weights = np.array([[0.9, 0.1, 0.0, 0.0], [0.1, 0.2, 0.7, 0.0], [0.0, 0.1, 0.2, 0.7]])
    assert alignment_error_rate([weights], [[(0, 0)]], None, [[(1, 1), (2, 1)]]) == pytest.approx(1 - 3 / 4)
    # No possible links: Och & Ney's 1 - 2|A & S| / (|A| + |S|), as before.
    assert alignment_error_rate([weights], [[(0, 0), (1, 1)]]) == pytest.approx(1 - 2 / 5)
    # None sure: the share of A outside the possible links (a digit's pixels).
    assert alignment_error_rate([weights], [[]], None, [[(0, 0), (1, 1), (3, 2)]]) == pytest.approx(1 / 3)
    # ... and a row whose peak is on EOS (the source's last position, past src_len) is a wrong link, not none.
    eos = np.array([[0.9, 0.1, 0.0, 0.0], [0.1, 0.0, 0.0, 0.9]])
    assert alignment_error_rate([eos], [[]], [(3, 2)], [[(0, 0), (1, 1)]]) == pytest.approx(1 / 2)
    assert alignment_error_rate([eos[1:]], [[]], [(3, 1)], [[(1, 0)]]) == pytest.approx(1.0)


def test_a_captioners_probe_is_its_image_lit_step_by_step_with_each_digits_image_boxed():
    images = np.zeros((2, 8, 8), dtype=np.int64)
    images[0, 2:6, 3] = 16  # a one
    images[1, 1, 1:7] = 16  # a bar
    ex = strip_example(images, np.array([1, 7]))
    cross = np.zeros((3, 129))
    cross[0, 3 * 8 + 2] = 1.0  # step 0 looks at the one's ink
    cross[1, :64] = 1 / 64  # step 1 everywhere in the wrong image
    cross[2, 128] = 1.0  # EOS looks at EOS
    sample = AttentionSample("test", [*ex.src, "</s>"], ["<s>", "1", "7"], ["1", "7", "</s>"],
                             {"cross": cross[None, None]}, np.zeros((0, 2), np.int64), np.array(ex.possible),
                             image=True)  # fmt: skip
    assert probe_aer(sample) == pytest.approx(1 / 2)  # one of the two digits looked outside its image
    fig = probe_figure(sample)
    ax = fig.axes[0]
    picture = ax.images[0].get_array()
    assert picture.shape == (3 * 8 + 2, 16, 3)
    lit = picture[2, 3]  # row 2, column 3 of step 0: the pixel attended, in the colour of the largest weight
    assert np.allclose(lit, np.asarray(ax.images[0].get_array()[2, 3]))
    assert lit[0] > lit[2] + 0.3  # orange, not the grey of ink or paper
    assert np.allclose(picture[0, 0], 1.0)  # paper nobody looked at stays white
    boxes = [
        (p.get_x(), p.get_y(), p.get_width(), p.get_height()) for p in ax.patches if isinstance(p, Rectangle)
    ]
    assert boxes == [(-0.5, -0.5, 8, 8), (7.5, 8.5, 8, 8)]  # step t's box on its own band, around image t
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "7", "</s>"]
    # The heatmap logged at each validation marks the possible links as it marks sure ones.
    logged = heatmap(sample, "cross", 0)
    mid = CELL // 2
    assert (logged[1 * CELL + mid, 64 * CELL + mid] == GOLD).all()  # step 1's digit begins at pixel 64
    assert not (logged[0 * CELL + mid, 64 * CELL + mid] == GOLD).all()


def test_a_captioner_learns_to_read_strips_and_looks_at_each_digit_as_it_emits_it(digits):
    """Two-digit strips, a few hundred steps: attention reads most digits right and its peak lies in the
    emitted digit's own image for nearly every digit; seeing the image only through the mean of its regions
    (its initial state), the same decoder does far worse."""
    accuracy, aer = {}, {}
    for attention in ("additive", "none"):
        torch.manual_seed(0)
        model = build_model(captioner(attention=attention, d_model=32), len(digits.src_vocab),
                            len(digits.tgt_vocab))  # fmt: skip
        fit(model, digits, epochs=6, lr=0.005, batch_size=32)
        model.eval()
        batch = batch_of(digits, count=200)
        with torch.no_grad():
            logits, weights = model(batch["src"], batch["tgt_in"], need_weights=True)
        digit = (batch["tgt_out"] != PAD_ID) & (batch["tgt_out"] != EOS_ID)
        accuracy[attention] = float((logits.argmax(-1) == batch["tgt_out"])[digit].float().mean())
        if weights["cross"]:
            examples = digits.splits["test"][:200]
            cross = weights["cross"][0].mean(1)
            aer[attention] = alignment_error_rate(
                list(cross), [ex.alignment for ex in examples], [(len(ex.src), len(ex.tgt)) for ex in examples],
                [ex.possible for ex in examples],
            )  # fmt: skip
    assert accuracy["additive"] >= 0.85 and aer["additive"] <= 0.05
    assert accuracy["additive"] > accuracy["none"] + 0.3


def test_a_captioners_position_limits_and_decoding_budget_count_regions_and_columns():
    # Location attention scores at most max_positions regions: 4 regions per 16 pixel tokens.
    assert captioner(attention="location", max_positions=52).position_limits == (208, None)
    assert captioner(attention="location", max_positions=50).position_limits == (192, None)
    # Decoding a strip of six digits (385 tokens with EOS) needs at most a caption per column, not per pixel.
    src = torch.ones(1, 385, dtype=torch.long)
    assert max_target_length(src, PAD_ID, 4, per_position=IMAGE_ROWS) == 2 * 48 + 10


def test_uniform_weights_make_their_heads_and_the_penalty_moot():
    keys = captioner(attention="uniform").ignored_keys()
    assert {"attention_heads", "doubly_stochastic"} <= set(keys)
    assert "attention_heads" not in captioner(attention="uniform", attention_window="local-p").ignored_keys()
    assert build_model(captioner(attention="uniform", doubly_stochastic=1.0), 21, 14).penalty is None
    with pytest.raises(ConfigError, match=r"^model.doubly_stochastic: has no effect \(weights cannot move"):
        load_config(None, None, ["model.arch=captioner", "task.name=digits", "model.attention=uniform",
                                 "model.doubly_stochastic=1"])  # fmt: skip


def test_a_captioner_is_refused_where_it_cannot_run():
    with pytest.raises(ConfigError) as info:
        load_config(None, "captioner-soft", [])
    assert str(info.value) == (
        "model.arch: captioner reads images, so it cannot read task reverse, whose sources are token sequences; "
        "a task whose source is an image: digits"
    )
    with pytest.raises(
        ConfigError, match=r"^model.doubly_stochastic: has no effect \(acts only with attention"
    ):
        load_config(None, None, ["model.arch=captioner", "task.name=digits", "model.doubly_stochastic=1"])
    with pytest.raises(ConfigError, match=r"^model.bidirectional: has no effect \(an LSTM setting; model.arch is "
                                          r"captioner\)"):  # fmt: skip
        load_config(None, "captioner-soft", ["task.name=digits", "model.bidirectional=false"])
    with pytest.raises(ConfigError, match=r"^model.attention_window: local-m centres each step's window on its "
                                          r"step number"):  # fmt: skip
        load_config(None, "captioner-soft", ["task.name=digits", "model.attention_window=local-m"])
    with pytest.raises(
        ConfigError, match=r"^model.doubly_stochastic: Input should be greater than or equal to 0"
    ):
        load_config(None, "captioner-soft", ["task.name=digits", "model.doubly_stochastic=-1"])
    # Any other family may read an image's pixels as a sequence of tokens.
    assert load_config(None, "lstm-bahdanau", ["task.name=digits"]).task.name == "digits"
