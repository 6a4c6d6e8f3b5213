"""Image captioning: an LSTM decoder attending over a CNN's regions of an image (Xu et al. 2015, "Show,
Attend and Tell"), the lectures' second use of attention.

The image arrives as its task gives it (schema/tasks.py Task.image): its pixels as tokens, column by column,
IMAGE_ROWS a column (models/sequences.py), then EOS; a token is a pixel's level. `RegionEncoder` folds them
back into the image: each level's embedding (a 1x1 convolution of the one-hot level), CONVOLUTIONS 3x3
convolutions with ReLU, then REGION x REGION average pooling. Each cell of that feature map is a region,
with a sinusoidal code of its column and a learned one of its row added: the decoder reads the digits in
order, and a convolution's features alone do not say where they are. Regions are in column-major order, as
the pixels.

The decoder is models/rnn.py's, with every switch of the LSTM family's decoder (score, query, input feeding,
heads, window), the regions its memory. Its initial state is Xu et al.'s f_init: each layer's h (and c) from
the mean of the regions' features through a linear layer and tanh. That mean is taken before the position
codes (whose mean says nothing of the content) and layer-normed (unnormed, the features grew until the tanh
saturated and a decoder that sees only the mean learned nothing). With `attention: none` that is all it sees
of the image (the bottleneck). `doubly_stochastic` = lambda adds Xu et al.'s penalty
lambda * sum_i (1 - sum_t alpha_ti)^2 over the regions i of each image, alpha summed over the caption's
steps t (`penalised`).

weights['cross'] are over the source's tokens, each region's weight spread evenly over the real pixels it
covers (EOS and padding get none), so alignment error and the probes read pixels as they read any source's
tokens, and the figure folds them back into the image (harness/attention_maps.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ablate.models.config import ModelConfig
from ablate.models.ensemble import Ensemble
from ablate.models.kinds import REGION
from ablate.models.positional_layers import SinusoidalEncoding
from ablate.models.rnn import RNNSeq2Seq
from ablate.models.sequences import EOS_ID, IMAGE_ROWS

CONVOLUTIONS = 2


class RegionEncoder(nn.Module):
    """Pixel tokens (B, S) -> regions (B, R, D) in column-major order, and which are real (B, R)."""

    def __init__(self, cfg: ModelConfig, vocab: int, pad_id: int, ensemble: Ensemble):
        super().__init__()
        d, self.pad_id, self.ensemble = cfg.d_model, pad_id, ensemble
        self.embed = ensemble.embedding(vocab, d, padding_idx=pad_id)
        self.convolutions = nn.ModuleList(ensemble.conv2d(d, d, 3, padding=1) for _ in range(CONVOLUTIONS))
        self.columns = SinusoidalEncoding(d, 64)
        self.rows = ensemble.embedding(IMAGE_ROWS // REGION, d)
        self.dropout = ensemble.dropout(cfg.dropout, "src")
        self.mean_norm = ensemble.norm(d)

    def image(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """src (B, S) -> the image's level ids (B, IMAGE_ROWS, W), W whole regions wide (PAD past the image
        and in place of EOS), and its real pixels (B, S)."""
        pixels = (src != self.pad_id) & (src != EOS_ID)
        width = -(-src.size(1) // (IMAGE_ROWS * REGION)) * REGION
        ids = F.pad(
            src.masked_fill(~pixels, self.pad_id), (0, width * IMAGE_ROWS - src.size(1)), value=self.pad_id
        )
        return ids.view(src.size(0), width, IMAGE_ROWS).transpose(1, 2), pixels

    def forward(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> the regions with their positions (B, R, D), which are real (B, R), and the mean of the real
        regions' features, without positions (B, D): the same for any order of the regions."""
        image, _ = self.image(src)
        real = (image != self.pad_id)[:, None].float()  # (B, 1, rows, W)
        x = self.embed(image).permute(0, 3, 1, 2)  # (B, D, rows, W)
        for convolution in self.convolutions:
            # A pixel past the image stays 0 at every layer, as the zero padding past an edge: a real region
            # is the same however much padding follows it.
            x = torch.relu(convolution(x)) * real.to(x.dtype)
        features = F.avg_pool2d(x, REGION).permute(0, 2, 3, 1)  # (B, rows', W', D)
        b, rows, cols, d = features.shape
        x = self.columns(features.reshape(b * rows, cols, d)).view(b, rows, cols, d)
        # (B, rows', D): each row's code, from each seed's own table
        row_codes = self.rows(torch.arange(rows, device=src.device).expand(b, rows))
        x = x + row_codes[:, :, None]
        regions = x.transpose(1, 2).reshape(b, cols * rows, d)  # column-major: r = column * rows' + row
        real_regions = F.max_pool2d(real, REGION)  # (B, 1, rows', W')
        padding = real_regions[:, 0].transpose(1, 2).reshape(b, -1) > 0  # (B, R)
        self.ensemble.measure("src", padding)
        mean = (features * real_regions[:, 0, ..., None]).sum((1, 2)) / real_regions.sum((1, 2, 3))[:, None]
        return self.dropout(regions), padding, self.mean_norm(mean)

    def region_of(self, length: int, device: torch.device) -> torch.Tensor:
        """(length,): the region each of a source's first `length` tokens lies in."""
        token = torch.arange(length, device=device)
        column, row = token // IMAGE_ROWS, token % IMAGE_ROWS
        return (column // REGION) * (IMAGE_ROWS // REGION) + row // REGION


class Captioner(RNNSeq2Seq):
    def __init__(self, cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int = 0, ensemble: int = 1):
        super().__init__(cfg, src_vocab, tgt_vocab, pad_id, ensemble)
        # f_init: each recurrent state of each layer from the mean region, (B, D) -> (B, layers·D)
        self.initial = nn.ModuleList(
            self.ensemble.linear(cfg.d_model, cfg.layers * cfg.d_model) for _ in self.state_names
        )
        # None where the config ignores it: no attention, or uniform weights, whose penalty is a constant.
        ignored = "doubly_stochastic" in cfg.ignored_keys()
        self.penalty = None if ignored or not cfg.doubly_stochastic else cfg.doubly_stochastic

    def make_encoder(self, cfg: ModelConfig, src_vocab: int, pad_id: int, ensemble: Ensemble) -> nn.Module:
        return RegionEncoder(cfg, src_vocab, pad_id, ensemble)

    def init_state(self, src: torch.Tensor) -> dict[str, torch.Tensor]:
        memory, padding, mean = self.encoder(src)
        state = {"memory": memory, "padding": padding, "step": src.new_zeros(src.size(0), 1)}
        if self.attention is not None:
            state["prepared"] = self.attention.prepare(memory)
        for name, initial in zip(self.state_names, self.initial):
            state[name] = torch.tanh(initial(mean)).view(src.size(0), self.cfg.layers, -1)  # (B, layers, D)
        if self.input_feeding:
            state["feed"] = memory.new_zeros(src.size(0), 1, self.cfg.d_model)
        return state

    def pixel_weights(self, weights: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        """Region weights (B, H, T, R) -> the source tokens' (B, H, T, S): each region's spread evenly over
        its real pixels."""
        _, pixels = self.encoder.image(src)
        region = self.encoder.region_of(src.size(1), src.device)  # (S,)
        counts = torch.zeros(src.size(0), weights.size(-1), device=src.device)
        counts = counts.index_add(1, region, pixels.float())  # (B, R): real pixels per region
        share = pixels / counts[:, region].clamp(min=1)  # (B, S)
        return weights[..., region] * share[:, None, None].to(weights.dtype)

    def penalised(self, src: torch.Tensor, tgt_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, V) and each image's doubly stochastic penalty (B,), lambda * sum over its real
        regions of (1 - the weight its caption's steps gave the region)^2, heads averaged; None when off."""
        if self.penalty is None:
            return self(src, tgt_in), None
        logits, weights = super().forward(src, tgt_in, need_weights=True)
        alpha = weights["cross"][0].float().mean(1)  # (B, T, R)
        steps = (tgt_in != self.pad_id)[..., None].float()  # (B, T, 1): the caption's steps
        attended = (alpha * steps).sum(1)  # (B, R)
        padding = self.ensemble.padding["src"].float()
        return logits, self.penalty * ((1 - attended) ** 2 * padding).sum(-1)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, need_weights: bool = False):
        """Teacher forcing: logits (B, T, V); with need_weights also {'cross': [weights (B, H, T, S) over the
        pixels]}, none without attention."""
        if not need_weights:
            return super().forward(src, tgt_in)
        logits, weights = super().forward(src, tgt_in, need_weights=True)
        return logits, {"cross": [self.pixel_weights(w, src) for w in weights["cross"]]}
