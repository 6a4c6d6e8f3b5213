"""Every bundled claim names its source, and only variants and metrics its study produces; the metrics a
configuration produces (harness.metrics.produced_metrics) are what a trial of it reports."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from ablate.analysis import claims
from ablate.analysis.claims import claim_sides
from ablate.harness.metrics import produced_metrics
from ablate.harness.study.validate import load_study
from ablate.harness.tasks import build_task
from ablate.harness.trial import run_trial
from ablate.schema.config import build_config, read_yaml
from ablate.schema.spec import StudySpec, bundled_studies_dir, variant_settings
from ablate.schema.tasks import TASKS, tasks_reading

STUDIES = sorted(bundled_studies_dir().glob("*.yaml"))
PROFILES = [
    (path, profile) for path in STUDIES for profile in (read_yaml(path).get("profiles") or {None: {}})
]


def bundled(path: Path, profile: str | None) -> StudySpec:
    """The study file checked without its data: claims and structure need none, so the bible study's are
    checked where Debian's Bibles are not installed."""
    return load_study(path, profile, read_data=False)


@pytest.mark.parametrize("path,profile", PROFILES, ids=[f"{p.stem}-{prof}" for p, prof in PROFILES])
def test_bundled_claims_cite_their_source_and_name_what_the_study_produces(path, profile):
    spec = bundled(path, profile)
    settings, overrides = variant_settings(spec), spec.variant_overrides()
    for claim in spec.claims:
        source = claim.source
        assert source is not None, f"{path.name}: {claim.text!r} names no source"
        assert all(part.strip() for part in (source.paper, source.where, source.reports)), claim.text
        for arm_metric, within in claim.arms(spec.metric.name):
            compare, to = claim_sides(settings, claim, within)
            assert compare and to, f"{path.name}: {claim.text!r} within {within} matches no variant"
            for variant in compare + to:
                produced = produced_metrics(spec.config_for(overrides[variant], spec.seed_pool[0]))
                assert arm_metric in produced, f"{path.name}: variant {variant} reports no {arm_metric}"


@pytest.mark.parametrize("path,profile", PROFILES, ids=[f"{p.stem}-{prof}" for p, prof in PROFILES])
def test_no_bundled_exact_match_claim_is_decided_at_two_seeds(path, profile):
    # Each compared cell split between variants (0.24 in one, 0.98 in its sibling), each variant's two
    # seeds agreeing, the other side at 0.99: a narrow interval at two seeds that two more could overturn.
    spec = bundled(path, profile)
    settings = variant_settings(spec)
    for claim in spec.claims:
        metrics = [metric for metric, _ in claim.arms(spec.metric.name)]
        if not any(metric.endswith("/seq_acc") for metric in metrics):
            continue
        compared = {
            v for _, within in claim.arms(spec.metric.name) for v in claim_sides(settings, claim, within)[0]
        }
        rows = [{"variant": v, "seed": seed, "state": "COMPLETE",
                 **dict.fromkeys(metrics, (0.24, 0.98)[i % 2] + 0.01 * k if v in compared else 0.99)}
                for i, v in enumerate(spec.variant_overrides()) for k, seed in enumerate(spec.seed_pool[:2])]  # fmt: skip
        df = pd.DataFrame(rows).assign(trial=range(len(rows)))
        result = claims.judge(spec, claim, df)
        assert not result.decided, f"{path.name}: {claim.text!r} decided at two seeds: {result.reason}"


# A finding judged on inputs of another kind as well: Bahdanau et al.'s fall with length, on symbols
# (bottleneck), on text (bible) and on images (captioning), each a test of how far it reaches.
ACROSS_KINDS = {
    ("Bahdanau et al. 2015", "Sec. 5.1, Fig. 2 (BLEU by sentence length)"): {"bible", "captioning"},
    ("Bahdanau et al. 2015", "Sec. 5.1, Fig. 2 (BLEU by sentence length) and Table 1"): {"bottleneck", "captioning"},
}


def test_each_bundled_claim_is_judged_in_one_study():
    # Two studies judging one finding of one paper from like runs would count it twice.
    studies: dict[tuple[str, str], set[str]] = {}
    for path, profile in PROFILES:
        for claim in bundled(path, profile).claims:
            studies.setdefault((claim.source.paper, claim.source.where), set()).add(path.stem)
    assert {place: names for place, names in studies.items() if len(names) > 1} == ACROSS_KINDS


@pytest.mark.parametrize("path,profile", PROFILES, ids=[f"{p.stem}-{prof}" for p, prof in PROFILES])
def test_alibi_claims_are_judged_where_alibi_can_see_order(path, profile):
    # ALiBi alone in a bidirectional encoder sees a source and its mirror image alike (README, positional
    # encodings): a claim about ALiBi is judged in a causal decoder-only model, as Press et al. test it.
    spec = bundled(path, profile)
    overrides = spec.variant_overrides()
    for claim in spec.claims:
        for variant in claims.claim_variants(spec, claim):
            model = spec.config_for(overrides[variant], spec.seed_pool[0]).model
            if model.arch == "transformer" and model.pos_encoding == "alibi":
                assert model.causal_mask and not model.cross_attention, f"{path.name}: {claim.text!r}"


TINY = {"task": {"n_train": 48, "n_valid": 8, "n_test": 8, "min_len": 5, "max_len": 6},
        "model": {"d_model": 16, "layers": 1, "heads": 2, "d_ff": 16, "dropout": 0.0},
        "train": {"batch_size": 16, "max_steps": 2, "val_every": 2}}  # fmt: skip


@pytest.mark.parametrize(
    "preset,task,model",
    [
        ("transformer", "reverse", {}),  # test_long, rank collapse of both stacks
        ("transformer", "synth_mt", {"cross_attention": False}),  # text, no encoder, no cross-attention
        ("lstm-bahdanau", "synth_mt", {}),  # text with gold alignments: AER
        ("lstm", "synth_mt", {"test_max_len": 6}),  # no attention: no AER; no test_long
    ],
)
def test_produced_metrics_are_what_a_trial_reports(preset, task, model, single_thread):
    task_keys = {k: v for k, v in model.items() if k.startswith("test_")}
    tree = {"preset": preset, **TINY, "task": {**TINY["task"], "name": task, **task_keys},
            "model": {**TINY["model"], **{k: v for k, v in model.items() if k not in task_keys}}}  # fmt: skip
    cfg = build_config(tree)
    reported = {k for k in run_trial(cfg).metrics if k.split("/")[0] in ("init", "val", "test", "test_long")}
    assert reported == produced_metrics(cfg)


def test_task_traits_match_the_data_the_tasks_build():
    for name in tasks_reading("test_max_len"):  # the generated tasks: their lengths are min_len / max_len
        model = {"arch": "classifier"} if TASKS[name].labelled else {}  # a label's task is a classifier's
        data = build_task(build_config({"task": {"name": name, "n_train": 8, "n_valid": 4, "n_test": 4,
                                                     "min_len": 5, "max_len": 6}, "model": model}).task, 0)  # fmt: skip
        assert data.is_text == TASKS[name].text, name
        assert all(ex.alignment is not None for ex in data.splits["test"]) == TASKS[name].aligned, name
        assert data.splits["test_long"], f"{name}: test_max_len defaults beyond max_len"


# Claims that hold by construction, kept as guards on the code: the report counts them apart from the tests
# of the papers' findings. (study, how the claim's text starts), in the order PROFILES reads them.
CHECKS = [
    ("attention-explanation", "On cues, attention pooling puts more of its weight on the rationale"),
    ("captioning", "The attending decoder's weights peak inside the image of the digit it emits"),
    ("causal-mask", "Without the causal mask, the teacher-forced validation loss falls"),
    ("causal-mask", "Without the causal mask, greedy decoding fails"),
    ("local-attention", "A monotonic window (local-m) cannot follow a verb moved to the end"),
    ("quickstart", "Without positional information a Transformer cannot reverse"),
    ("rnn-scores", "Location-based attention, which never looks at the source words"),
]


def test_bundled_claims_that_hold_by_construction_are_checks():
    checks = [(path.stem, claim.text) for path, profile in PROFILES for claim in bundled(path, profile).claims
              if claim.kind == "check"]  # fmt: skip
    checks = list(dict.fromkeys(checks))  # a file's profiles share its claims
    assert len(checks) == len(CHECKS), checks
    starts = [(study, start) for (study, text), (_, start) in zip(checks, CHECKS) if text.startswith(start)]
    assert starts == CHECKS, checks
