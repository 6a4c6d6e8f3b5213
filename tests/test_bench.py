"""`ablate bench`: the quick run yields every figure, the reference model is the same function as ours, the
FLOP count matches torch's counter, and timing interleaves the compared runs. Nothing here is timed."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import ablate
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from ablate.bench.run import resolve_device
from ablate.bench.timing import interleaved
from ablate.bench.training import TorchTransformer, transformer_train_flops
from ablate.bench.workload import Sizes, random_batch, transformer_config
from ablate.cli import app
from ablate.models import build_model
from ablate.models.sequences import PAD_ID
from ablate.models.steps import token_cross_entropy

pytestmark = pytest.mark.usefixtures("single_thread")

SIZES = Sizes(d_model=32, heads=4, d_ff=64, layers=2, batch=6, length=9, vocab=30, steps=1, repeats=1)
CPU = torch.device("cpu")
# Every figure `ablate bench` measures, in the order it prints them (d_greedy's step also gives d_beam).
FIGURE_KEYS = ("a_transformer_step", "b_harness_overhead", "c_lstm_parallel", "d_greedy", "d_beam",
               "e_padding", "f_sweep_scaling", "g_mfu", "h_fused_seeds", "i_fused_trials", "j_compile_quickstart",
               "k_trial_vs_captured")  # fmt: skip


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_quick_bench_yields_every_figure_as_json():
    proc = ablate("bench", "--quick", "--json", "--device", "cpu", "--threads", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    *figure_lines, last = proc.stdout.strip().splitlines()
    result = json.loads(last)
    # Each figure came out on its own line as it was measured, in order, before the whole run's line.
    streamed = [json.loads(line)["figure"] for line in figure_lines]
    assert [f["key"] for f in streamed] == list(FIGURE_KEYS)
    assert streamed == list(result["figures"].values())
    assert result["quick"] is True
    assert result["machine"]["device"] == "cpu" and len(result["machine"]["load_avg_1_5_15"]) == 3
    assert set(result["figures"]) == set(FIGURE_KEYS)
    for key, figure in result["figures"].items():
        if figure["status"] == "skipped":
            assert figure["reason"], key
        else:
            assert figure["status"] in ("pass", "fail", "info"), key
            assert (
                isinstance(figure["value"], float) and math.isfinite(figure["value"]) and figure["value"] > 0
            ), key
    assert result["figures"]["g_mfu"]["reason"] == "no CUDA device"
    assert (
        result["figures"]["e_padding"]["value"] < result["figures"]["e_padding"]["detail"]["random_batches"]
    )


def test_bad_device_is_a_one_line_error():
    result = CliRunner().invoke(app, ["bench", "--device", "tpu", "--json"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: --device: expected cpu or cuda (got 'tpu')"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_a_device_is_refused():
    with pytest.raises(ValueError, match="no CUDA device"):
        resolve_device("cuda")


def copy_into_reference(ours, reference: TorchTransformer) -> None:
    """Loads our Transformer's weights into torch.nn.Transformer's layout (fused q/k/v projection)."""
    state = {"src_embed.weight": ours.src_embed.weight, "tgt_embed.weight": ours.tgt_embed.weight,
             "generator.weight": ours.generator.weight, "generator.bias": ours.generator.bias}  # fmt: skip
    for side, stack in (("encoder", ours.encoder), ("decoder", ours.decoder)):
        for i, layer in enumerate(stack):
            prefix = f"core.{side}.layers.{i}."
            sublayers = {"self_attn": layer.self_attn}
            if side == "decoder":
                sublayers["multihead_attn"] = layer.cross_attn
            for name, sublayer in sublayers.items():
                attn = sublayer.fn.attn
                projections = (attn.q_proj, attn.k_proj, attn.v_proj)
                state[f"{prefix}{name}.in_proj_weight"] = torch.cat([p.weight for p in projections])
                state[f"{prefix}{name}.in_proj_bias"] = torch.cat([p.bias for p in projections])
                state[f"{prefix}{name}.out_proj.weight"] = attn.out_proj.weight
                state[f"{prefix}{name}.out_proj.bias"] = attn.out_proj.bias
            for j, linear in ((1, layer.ff.fn.net[0]), (2, layer.ff.fn.net[3])):
                state[f"{prefix}linear{j}.weight"], state[f"{prefix}linear{j}.bias"] = (
                    linear.weight,
                    linear.bias,
                )
            norms = [*(s.post_norm for s in sublayers.values()), layer.ff.post_norm]
            for j, norm in enumerate(norms, start=1):
                state[f"{prefix}norm{j}.weight"], state[f"{prefix}norm{j}.bias"] = norm.weight, norm.bias
    reference.load_state_dict(state, strict=True)


def test_reference_is_our_transformer_built_on_torch_nn_transformer():
    """Same weights, same logits: the throughput comparison times one function computed two ways."""
    torch.manual_seed(0)
    cfg = transformer_config(SIZES)
    ours = build_model(cfg, SIZES.vocab, SIZES.vocab, PAD_ID).eval()
    reference = TorchTransformer(cfg, SIZES.vocab).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in reference.parameters())
    copy_into_reference(ours, reference)
    batch = random_batch(SIZES, CPU)
    assert (batch["src"] == PAD_ID).any() and (batch["tgt_in"] == PAD_ID).any()
    real = batch["tgt_out"] != PAD_ID
    with torch.no_grad():
        expected = ours(batch["src"], batch["tgt_in"])[real]
        got = reference(batch["src"], batch["tgt_in"])[real]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_flop_count_matches_torch_flop_counter():
    """torch's counter sees every matmul of the explicit attention path (need_weights=True), where the
    causal self-attention computes its masked upper triangle too, which our count leaves out."""
    cfg = transformer_config(SIZES, dropout=0.0)
    model = build_model(cfg, SIZES.vocab, SIZES.vocab, PAD_ID)
    batch = random_batch(SIZES, CPU, padded=False)
    with FlopCounterMode(display=False) as counter:
        logits, _ = model(batch["src"], batch["tgt_in"], need_weights=True)
        token_cross_entropy(logits, batch["tgt_out"]).backward()
    n = SIZES.length
    masked_half = 3 * SIZES.batch * cfg.layers * 2 * n * n * cfg.d_model
    expected = transformer_train_flops(cfg, SIZES.batch, n, n, SIZES.vocab) + masked_half
    assert counter.get_total_flops() == expected


def test_runs_interleave_after_warmup():
    calls: list[str] = []
    seconds = interleaved(
        {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, CPU, repeats=3, warmup=1
    )
    assert calls == ["a", "b"] * 4
    assert set(seconds) == {"a", "b"} and all(s >= 0 for s in seconds.values())


def test_a_spent_budget_starts_no_new_repeat():
    calls: list[str] = []
    interleaved({"a": lambda: calls.append("a")}, CPU, repeats=5, warmup=1, budget_s=0.0)
    assert calls == ["a", "a"]  # the warm-up, then the one repeat that always runs


@pytest.mark.slow  # over 10 s on 2 cores (processes that import the stack, or whole sweeps)
def test_only_measures_the_figures_named_and_refuses_an_unknown_one():
    proc = ablate("bench", "--quick", "--json", "--device", "cpu", "--only", "e_padding,k_trial_vs_captured")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert list(json.loads(proc.stdout.strip().splitlines()[-1])["figures"]) == ["e_padding", "k_trial_vs_captured"]
    proc = ablate("bench", "--quick", "--device", "cpu", "--only", "e_padding,z_nothing")
    assert proc.returncode == 2 and "--only: unknown figure z_nothing; known: a_transformer_step" in proc.stderr
