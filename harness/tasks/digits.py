"""digits: strips of real handwritten digits, captioned by the digits they show (an image-to-sequence task).

The images are scikit-learn's bundled handwritten digits (load_digits: 1,797 images of 8 x 8 pixels, each
pixel one of 17 levels, 0-16), read from the installed package, never downloaded. They are split once, by a
fixed seed, into training, validation and test images (IMAGE_SHARES), so no test image is ever trained on,
whatever the trial's seed. A strip of n digits is n images side by side (8 x 8n pixels); its source is its
pixels as tokens of their level, column by column from the left, each column top to bottom
(models/sequences.py IMAGE_ROWS), and its target the n digits. Lengths are in digits: train, valid and test
strips have min_len..max_len, test_long (max_len, test_max_len], each drawn with the trial's seed from its
split's images.

Gold alignment: the k-th emitted digit lies in the k-th image, pixels [64k, 64(k+1)); all of them are
possible links (Example.possible), none sure, so alignment error is the share of emitted digits whose most
attended pixel lies outside their own image."""

from __future__ import annotations

import numpy as np

from ablate.harness.tasks.base import Example, TaskData, Vocab, longest_target
from ablate.harness.tasks.synthetic import sample_splits
from ablate.models.sequences import IMAGE_ROWS
from ablate.schema.errors import ConfigError
from ablate.schema.task_config import TaskConfig

LEVELS = tuple(str(level) for level in range(17))
DIGITS = tuple(str(digit) for digit in range(10))
IMAGE_SHARES = {"train": 0.6, "valid": 0.2, "test": 0.2}
SPLIT_SEED = 0  # which images are whose: the same for every trial


def load_images() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: images (N, 8, 8) of integer levels 0-16, and their digits (N,)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise ConfigError(
            "task.name: digits reads scikit-learn's bundled digits, and scikit-learn is not installed "
            "(pip install 'attention-ablate[digits]')"
        ) from e
    digits = load_digits()
    return digits.images.astype(np.int64), digits.target.astype(np.int64)


def image_pools(count: int) -> dict[str, np.ndarray]:
    """Each split's image indices: a fixed permutation cut by IMAGE_SHARES; test_long draws from test's."""
    order = np.random.default_rng(SPLIT_SEED).permutation(count)
    ends = np.cumsum([round(share * count) for share in IMAGE_SHARES.values()])
    ends[-1] = count
    return dict(zip(IMAGE_SHARES, np.split(order, ends[:-1])))


def strip_example(images: np.ndarray, digits: np.ndarray) -> Example:
    """The strip of `images` (n, 8, 8) side by side, captioned by `digits` (n,), with its gold alignment."""
    strip = np.concatenate(list(images), axis=1)  # (8, 8n)
    pixels = strip.T.reshape(-1)  # column by column, each top to bottom
    per_image = IMAGE_ROWS * images.shape[2]
    possible = tuple((k * per_image + i, k) for k in range(len(digits)) for i in range(per_image))
    return Example(tuple(LEVELS[v] for v in pixels), tuple(DIGITS[d] for d in digits), (), possible)


def digits_task(cfg: TaskConfig, seed: int) -> TaskData:
    images, labels = load_images()
    if images.shape[1] != IMAGE_ROWS:
        raise ConfigError(f"task.name: digits images are {images.shape[1]} pixels high, not {IMAGE_ROWS}")
    pools = image_pools(len(images))

    def sampler(pool: np.ndarray):
        def sample(rng: np.random.Generator, length: int) -> Example:
            chosen = pool[rng.integers(0, len(pool), size=length)]
            return strip_example(images[chosen], labels[chosen])

        return sample

    splits = sample_splits("digits", {split: sampler(pool) for split, pool in pools.items()}, cfg, seed)
    meta = {"images": {split: len(pool) for split, pool in pools.items()}}
    return TaskData(
        "digits",
        splits,
        Vocab(LEVELS),
        Vocab(DIGITS),
        train_max_len=longest_target(splits["train"]),
        meta=meta,
    )
