"""Attention model families: plain torch.nn building blocks and one LightningModule."""

from torch import nn

from models.config import PRESETS, ModelConfig


def build_model(cfg: ModelConfig, src_vocab: int, tgt_vocab: int, pad_id: int = 0) -> nn.Module:
    """The nn.Module for `cfg.arch`; every family shares forward / init_state / step."""
    from models.rnn import RNNSeq2Seq
    from models.transformer import Transformer

    family = {"lstm": RNNSeq2Seq, "transformer": Transformer}[cfg.arch]
    return family(cfg, src_vocab, tgt_vocab, pad_id)


__all__ = ["PRESETS", "ModelConfig", "build_model"]
