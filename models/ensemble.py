"""K seeds of one variant fused into one model: every parameter gets a leading seed axis K.

Tensors between layers stay batch-first, the batch axis K·B and seed-major (rows [k*B:(k+1)*B] are seed
k's), so attention, masks and decoding run unchanged; a parameter layer views its input as (K, B·..., in).
`Ensemble` builds each parameter layer once per seed, as a plain model does, and fuses the K (the ensemble
layers below; any other parameter is stacked). K = 1 builds the plain layer itself, so a plain model is
unchanged; for K > 1 parameters keep their names, K in front (`seed_state_dict`, `fuse_state_dicts`).

Each seed's numbers are those it gets alone, to float rounding, given its own
- dropout masks: SeedDropout draws seed k's from seed k's generator over its own lengths, whatever padding
  the K batches were stacked with (the plain model must be seeded the same way);
- loss: the sum over seeds of each seed's mean token loss (models/steps.py's `per_seed_loss`);
- gradient clipping: `clip_grad_norm_per_seed`;
- optimiser state: AdamW is elementwise, so one AdamW over the stacked parameters updates each seed as its
  own would; `ActiveSeeds` freezes a seed that stopped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn


def per_seed(x: torch.Tensor, k: int) -> torch.Tensor:
    """(K·B, ...) -> (K, B, ...): seed k's rows are the k-th block of the batch axis."""
    return x.unflatten(0, (k, -1))


def per_row(t: torch.Tensor, rows: int) -> torch.Tensor:
    """(K, ...) -> (rows, ...), seed k's entry on each of its rows (seed-major, rows = K·B); a (1, ...)
    tensor, the same for every seed, stays as it is to broadcast."""
    return t if t.size(0) == 1 else t.repeat_interleave(rows // t.size(0), dim=0)


def seed_axis(p: torch.Tensor, k: int) -> torch.Tensor:
    """A parameter with its leading K axis, which a plain model's (K = 1) lacks."""
    return p if k > 1 else p[None]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, per seed when the weight has a seed axis: x (K·B, ..., in), weight (K, out, in), bias
    (K, out)."""
    if weight.dim() == 2:
        return F.linear(x, weight, bias)
    k, d_out, d_in = weight.shape
    rows = x.reshape(k, -1, d_in)  # (K, B·..., in)
    w = weight.transpose(1, 2)  # (K, in, out)
    y = torch.bmm(rows, w) if bias is None else torch.baddbmm(bias[:, None], rows, w)
    return y.view(*x.shape[:-1], d_out)


def stack(plain: Sequence[nn.Module], name: str) -> nn.Parameter | None:
    """The parameter `name` of K plain modules, stacked on a new leading seed axis."""
    if getattr(plain[0], name) is None:
        return None
    return nn.Parameter(torch.stack([getattr(module, name).detach() for module in plain]))


class EnsembleLinear(nn.Module):
    """K nn.Linear layers, one per seed: weight (K, out, in), bias (K, out); a batched matmul."""

    def __init__(self, plain: Sequence[nn.Linear]):
        super().__init__()
        self.in_features, self.out_features = plain[0].in_features, plain[0].out_features
        self.weight, self.bias = stack(plain, "weight"), stack(plain, "bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class EnsembleEmbedding(nn.Module):
    """K nn.Embedding tables, one per seed: weight (K, n, d), looked up as one table of K·n rows."""

    def __init__(self, plain: Sequence[nn.Embedding]):
        super().__init__()
        self.num_embeddings, self.embedding_dim = plain[0].num_embeddings, plain[0].embedding_dim
        self.padding_idx = plain[0].padding_idx
        self.weight = stack(plain, "weight")

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """tokens (K·B, ...) -> (K·B, ..., d)."""
        k, n, d = self.weight.shape
        offsets = torch.arange(k, device=tokens.device)[:, None] * n  # seed k's rows of the K·n-row table
        rows = F.embedding(tokens.reshape(k, -1) + offsets, self.weight.view(k * n, d))  # (K, B·..., d)
        out = rows.view(*tokens.shape, d)
        if self.padding_idx is None:
            return out
        # nn.Embedding's padding_idx: a lookup sends no gradient to the padding row (a tied output layer may).
        return torch.where((tokens == self.padding_idx)[..., None], out.detach(), out)


class EnsembleNorm(nn.Module):
    """K nn.LayerNorm or nn.RMSNorm layers: every row normalised as by theirs, then scaled (and shifted) by
    its seed's weight (K, d) (and bias)."""

    def __init__(self, plain: Sequence[nn.LayerNorm | nn.RMSNorm]):
        super().__init__()
        self.rms, self.eps = isinstance(plain[0], nn.RMSNorm), plain[0].eps
        self.weight, self.bias = stack(plain, "weight"), None if self.rms else stack(plain, "bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (x.size(-1),)
        y = F.rms_norm(x, shape, eps=self.eps) if self.rms else F.layer_norm(x, shape, eps=self.eps)
        y = per_seed(y, self.weight.size(0)).flatten(1, -2) * self.weight[:, None]  # (K, B·..., d)
        if self.bias is not None:
            y = y + self.bias[:, None]
        return y.view(x.shape)


class EnsembleConv2d(nn.Module):
    """K nn.Conv2d layers, one per seed: weight (K, out, in, kh, kw), bias (K, out); one convolution grouped
    by seed over the K seeds' channels side by side."""

    def __init__(self, plain: Sequence[nn.Conv2d]):
        super().__init__()
        self.stride, self.padding = plain[0].stride, plain[0].padding
        self.weight, self.bias = stack(plain, "weight"), stack(plain, "bias")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (K·B, in, H, W) -> (K·B, out, H', W')."""
        k, d_out = self.weight.shape[:2]
        b = x.size(0) // k
        side_by_side = per_seed(x, k).transpose(0, 1).flatten(1, 2)  # (B, K·in, H, W)
        bias = None if self.bias is None else self.bias.flatten()
        y = F.conv2d(side_by_side, self.weight.flatten(0, 1), bias, self.stride, self.padding, groups=k)
        return y.view(b, k, d_out, *y.shape[2:]).transpose(0, 1).flatten(0, 1)


# The torch layers a fused model holds K of, and the layer that holds them.
ENSEMBLE_LAYERS: dict[type[nn.Module], type[nn.Module]] = {
    nn.Linear: EnsembleLinear, nn.Embedding: EnsembleEmbedding,
    nn.LayerNorm: EnsembleNorm, nn.RMSNorm: EnsembleNorm, nn.Conv2d: EnsembleConv2d,
}  # fmt: skip


def fuse_modules(plain: Sequence[nn.Module]) -> nn.Module:
    """K plain modules of one structure -> one module of K seeds: the first, each of its torch layers
    replaced by the ensemble layer of the K, each other parameter stacked (its forward reads K off it)."""
    first = plain[0]
    if type(first) in ENSEMBLE_LAYERS:
        return ENSEMBLE_LAYERS[type(first)](plain)
    for name, _ in list(first.named_children()):
        setattr(first, name, fuse_modules([getattr(module, name) for module in plain]))
    for name, _ in list(first.named_parameters(recurse=False)):
        setattr(first, name, stack(plain, name))
    return first


class SeedDropout(nn.Dropout):
    """nn.Dropout with a mask per seed. Once seeded (`seed_dropout`), seed k's mask comes from its own
    generator and covers only its extent: along each dim after the batch axis named in `axes` ('src' or
    'tgt'; None: the whole dim), its longest real sequence on that side. So each seed draws exactly what its
    model draws alone. An unseeded plain model is nn.Dropout on the global generator."""

    def __init__(self, p: float, ensemble: Ensemble, axes: tuple[str | None, ...] = ()):
        super().__init__(p)
        self.ensemble, self.axes = ensemble, axes

    def draws_per_seed(self) -> bool:
        """Whether a call in this mode draws each seed's mask from its own generator."""
        if not (self.training and self.p > 0):
            return False
        if self.ensemble.generators is None:
            if self.ensemble.k > 1:
                raise RuntimeError("a fused model draws each seed's dropout from its own generator: call "
                                   "seed_dropout(model, seeds) before training it")  # fmt: skip
            return False
        return True

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x (K·B, ...); offset: the position of x's first element along the named dims (a decoder step)."""
        if not self.draws_per_seed():
            return super().forward(x)
        return x * torch.cat([self.mask(part, k, offset) for k, part in enumerate(x.chunk(self.ensemble.k))])

    def seed_forward(self, x: torch.Tensor, seed: int, offset: int = 0) -> torch.Tensor:
        """One seed's tensor alone, such as its packed sequences."""
        return x * self.mask(x, seed, offset) if self.draws_per_seed() else super().forward(x)

    def mask(self, x: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
        """Seed `seed`'s mask for its part x: kept entries 1 / (1 - p), as nn.Dropout's, and zero past its
        extent."""
        extent = list(x.shape)
        for dim, side in enumerate(self.axes, start=1):
            lengths = self.ensemble.lengths(side) if side else None
            if lengths is not None:
                extent[dim] = min(max(lengths[seed] - offset, 0), x.size(dim))
        kept = x.new_empty(extent)
        if kept.numel():  # a seed with nothing here (a step past its targets) draws nothing, as alone
            kept.bernoulli_(1 - self.p, generator=self.ensemble.generators[seed]).div_(1 - self.p)
        if extent == list(x.shape):
            return kept
        mask = x.new_zeros(x.shape)
        mask[tuple(map(slice, extent))] = kept
        return mask


class Ensemble:
    """What one model's layers share about its K seeds (K = 1: plain): the factory of its parameter and
    dropout layers, each seed's dropout generator, and each seed's lengths in the current forward pass."""

    def __init__(self, k: int = 1):
        self.k = k
        self.generators: list[torch.Generator] | None = None  # seed_dropout sets one per seed
        self.padding: dict[str, torch.Tensor] = {}  # side -> (K·B, L), True at real tokens
        self.measured: dict[str, list[int]] = {}

    def shape(self, *dims: int) -> tuple[int, ...]:
        """A raw parameter's shape: its plain shape, after K when K > 1."""
        return (self.k, *dims) if self.k > 1 else dims

    def stacked(self, make: Callable[[], nn.Module]) -> nn.Module:
        """A layer built once per seed as a plain model builds it (its initialisation, a registry's entry),
        the K fused (fuse_modules); for K = 1, the plain layer itself."""
        plain = [make() for _ in range(self.k)]
        return plain[0] if self.k == 1 else fuse_modules(plain)

    def linear(self, in_features: int, out_features: int, bias: bool = True) -> nn.Module:
        return self.stacked(lambda: nn.Linear(in_features, out_features, bias))

    def embedding(self, num_embeddings: int, dim: int, padding_idx: int | None = None) -> nn.Module:
        return self.stacked(lambda: nn.Embedding(num_embeddings, dim, padding_idx))

    def conv2d(self, in_channels: int, out_channels: int, kernel_size: int, padding: int = 0) -> nn.Module:
        return self.stacked(lambda: nn.Conv2d(in_channels, out_channels, kernel_size, padding=padding))

    def norm(self, d: int, rms: bool = False) -> nn.Module:
        return self.stacked(lambda: nn.RMSNorm(d) if rms else nn.LayerNorm(d))

    def dropout(self, p: float, *axes: str | None) -> SeedDropout:
        return SeedDropout(p, self, axes)

    def measure(self, side: str, padding: torch.Tensor) -> None:
        """The real tokens (K·B, L) of a side in this forward pass; each seed's length is read on demand."""
        self.padding[side] = padding
        self.measured.pop(side, None)

    def lengths(self, side: str) -> list[int] | None:
        """Each seed's longest real sequence on `side` in this forward pass; None if not measured."""
        if side not in self.measured and side in self.padding:
            # Padding trails, so the positions real in any of a seed's rows are its first `length`.
            self.measured[side] = per_seed(self.padding[side], self.k).any(1).sum(1).tolist()
        return self.measured.get(side)


def seed_dropout(model: nn.Module, seeds: Sequence[int]) -> list[torch.Generator]:
    """Gives seed k of `model` its own dropout generator, seeded with seeds[k], on the model's device; a plain
    model takes one seed. Returns the generators (a resumed run restores their states with set_state)."""
    device = next(model.parameters()).device
    generators = [torch.Generator(device).manual_seed(seed) for seed in seeds]
    for module in model.modules():
        if isinstance(module, SeedDropout):
            if module.ensemble.k != len(seeds):
                raise ValueError(f"{len(seeds)} seeds for a model of {module.ensemble.k}")
            module.ensemble.generators = generators
    return generators


def fuse_state_dicts(states: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """K plain state dicts -> the fused model's, each entry stacked on a new leading axis (K = 1: as is)."""
    if len(states) == 1:
        return dict(states[0])
    return {name: torch.stack([state[name] for state in states]) for name in states[0]}


def seed_state_dict(fused: nn.Module, k: int) -> dict[str, torch.Tensor]:
    """Seed k's slice of a fused model: the state dict of the plain model it stands for (copies, so that a
    saved seed does not carry the other seeds' storage)."""
    return {name: seed_axis(t, fused.ensemble.k)[k].clone() for name, t in fused.state_dict().items()}


def fuse_models(models: Sequence[nn.Module]) -> nn.Module:
    """One model whose seed k is models[k], plain models of one family and config (each built under its own
    seed, which so keeps its own initialisation). Unseeded: call seed_dropout before training."""
    first = models[0]
    with torch.random.fork_rng(devices=[]):  # its initialisation is overwritten: leave the global stream be
        fused = type(first)(first.cfg, *first.vocab, first.pad_id, ensemble=len(models))
    fused.load_state_dict(fuse_state_dicts([model.state_dict() for model in models]))
    return fused.to(next(first.parameters()).device)


@torch.no_grad()
def clip_grad_norm_per_seed(model: nn.Module, max_norm: float, k: int) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_ for each seed on its own: seed k's norm is over its slice of every
    gradient, and only that slice is scaled. Returns the K norms before clipping."""
    grads = [seed_axis(p.grad, k) for p in model.parameters() if p.grad is not None]  # each (K, ...)
    norms = torch.stack([torch.linalg.vector_norm(g.reshape(k, -1), dim=1) for g in grads])  # (params, K)
    total = torch.linalg.vector_norm(norms, dim=0)  # (K,)
    scale = (max_norm / (total + 1e-6)).clamp(max=1.0)  # clip_grad_norm_'s factor, per seed
    for g in grads:
        g.mul_(scale.view(k, *[1] * (g.dim() - 1)))
    return total


class ActiveSeeds:
    """Which seeds of a fused model `optimizer` still trains. After every step a stopped seed's slice of each
    parameter and optimiser state is put back, so neither weight decay nor the moments move it (new state
    starts at zero there); done in step hooks, so any caller of `optimizer.step` (Lightning) keeps it."""

    def __init__(self, optimizer: torch.optim.Optimizer):
        self.stopped: list[int] = []
        self.saved: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
        optimizer.register_step_pre_hook(self.save)
        optimizer.register_step_post_hook(self.restore)

    def stop(self, seed: int) -> None:
        if seed not in self.stopped:
            self.stopped.append(seed)

    @staticmethod
    def seed_tensors(optimizer: torch.optim.Optimizer, p: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parameter and its state with a seed axis (Adam's moments, not its step count)."""
        state = optimizer.state.get(p, {})
        stacked = {name: s for name, s in state.items() if torch.is_tensor(s) and s.shape == p.shape}
        return {"param": p, **stacked}

    @torch.no_grad()
    def save(self, optimizer: torch.optim.Optimizer, *_) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]] if self.stopped else []
        self.saved = [
            (p, {name: t[self.stopped].clone() for name, t in self.seed_tensors(optimizer, p).items()})
            for p in params
        ]

    @torch.no_grad()
    def restore(self, optimizer: torch.optim.Optimizer, *_) -> None:
        for p, saved in self.saved:
            for name, t in self.seed_tensors(optimizer, p).items():
                t[self.stopped] = saved.get(name, 0.0)
        self.saved = []
