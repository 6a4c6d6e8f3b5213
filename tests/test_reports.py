"""Reports end to end: a constructed study in a real Optuna storage (every trial state, artifacts in trial
folders and in the artifact store, a tune phase), a tiny real study, escaping, partial and empty studies."""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import optuna_dashboard
import pandas as pd
import pytest
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN
from scipy import stats as sps

from ablate.analysis import stats
from ablate.harness.artifacts import AttentionSample, study_dir
from ablate.harness.study.queue import prepare_study
from ablate.harness.study.storage import open_storage
from ablate.harness.workers import run_worker
from ablate.reports import collect, headline, plots
from ablate.reports.formats import md_cell
from ablate.reports.render import (
    build_report,
    importance_evaluator,
    importance_frame,
    log_summary_run,
    train_max_len,
    variant_summary,
)
from ablate.schema.spec import StudySpec
from ablate.schema.trials import optuna_study_name

optuna.logging.set_verbosity(optuna.logging.WARNING)

GRID = {"model.pos_encoding": ["sinusoidal", "none"], "model.norm": ["post", "pre"]}
EVIL = "<script>alert(1)</script>"
STUDY_NAME = f"{EVIL} & co"
CLAIM = {"text": "Without positions <b>reversal</b> fails.", "compare": {"model.pos_encoding": "none"},
         "to": {"model.pos_encoding": "sinusoidal"}, "metric": "test/seq_acc", "expect": "lower", "margin": 0.3}  # fmt: skip
SIGNATURES = {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
              "chrf": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"}  # fmt: skip
SRC, TGT = ["a", "b", "c", "</s>"], ["c", "b", "a", "</s>"]
ALIGNMENT = np.array([[2, 0], [1, 1], [0, 2]])  # reversal: target t comes from source 2 - t


def attention_sample(aligned: bool) -> AttentionSample:
    """Cross attention on the gold anti-diagonal (AER 0), or uniform (argmax column 0 everywhere: one
    hit of three links, AER 1 - 2/6)."""
    if aligned:
        rows = np.eye(4)[[2, 1, 0, 3]]
    else:
        rows = np.full((4, 4), 0.25)
    cross = np.broadcast_to(rows, (2, 2, 4, 4)).astype(np.float32)
    return AttentionSample("test", SRC, ["<s>", *TGT[:-1]], TGT, {"cross": cross}, ALIGNMENT)


def write_trial_files(folder: Path, quality: float, aligned: bool) -> None:
    history = [
        {"step": s, "val/seq_acc": quality * s / 30, "val/loss": 2.0 - quality * s / 30} for s in (10, 20, 30)
    ]
    per_length = [{"split": "test" if n <= 5 else "test_long", "length": n, "n": 10, "seq_acc": quality / (n - 1),
                   "tok_acc": quality} for n in range(2, 8)]  # fmt: skip
    (folder / "attention").mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"history": history, "per_length": per_length}))
    attention_sample(aligned).save(folder / "attention" / "probe0_test.npz")


def synthetic_study(
    tmp_path: Path,
    name: str = STUDY_NAME,
    variants: dict | None = None,
    states=None,
    keys: dict | None = None,
):
    """A study as the harness leaves it: spec in the eval study, per-variant tune studies, trials with their
    user attrs. By default the variant (pos_encoding=none, norm=pre) has one seed failed, one complete and
    one running; (sinusoidal, pre) has a pruned seed and (none, post) a waiting one. Trial 0 keeps its
    files in the artifact store only. User text holds HTML throughout. `keys` replace the study file's
    (a trial reports the study metric and test/tok_acc)."""
    spec = StudySpec.model_validate({
        "name": name, "description": "A constructed <em>study</em> & its trials.",
        **({"variants": variants} if variants else {"factors": GRID, "claims": [CLAIM]}),
        "seeds": [0, 1, 2], "metric": {"name": "test/seq_acc"},
        "tune": {"params": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, "trials": 4},
        "base": {"task": {"max_len": 5}}, **(keys or {}),
    })  # fmt: skip
    runs = tmp_path / "runs"
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(study_name=optuna_study_name(spec), storage=storage, direction="maximize")
    study.set_user_attr("spec", spec.model_dump(mode="json"))
    store = optuna.artifacts.FileSystemArtifactStore(str(study_dir(spec.slug, runs) / "artifacts"))
    (study_dir(spec.slug, runs) / "artifacts").mkdir(parents=True)
    states = states if states is not None else {
        ("pos_encoding=none,norm=pre", 0): "FAIL", ("pos_encoding=none,norm=pre", 2): "RUNNING",
        ("pos_encoding=none,norm=post", 2): "WAITING", ("pos_encoding=sinusoidal,norm=pre", 2): "PRUNED",
    }  # fmt: skip
    rng = np.random.default_rng(0)
    waiting = []
    for variant, overrides in spec.variant_overrides().items():
        positional = overrides.get("model.pos_encoding", "sinusoidal") != "none"
        quality = (0.85 if positional else 0.15) + (0.05 if overrides.get("model.norm") == "pre" else 0.0)
        tune = optuna.create_study(study_name=optuna_study_name(spec, "tune", variant), storage=storage,
                                   direction="maximize")  # fmt: skip
        for lr in (1e-4, 1e-3, 3e-3, 1e-2):
            tune.add_trial(optuna.create_trial(
                params={"train.lr": lr}, value=quality - abs(math.log10(lr) + 3) / 10, user_attrs={"variant": variant},
                distributions={"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True)},
            ))  # fmt: skip
        for seed in spec.seeds:
            state = states.get((variant, seed), "COMPLETE")
            if state == "WAITING":
                waiting.append({"variant": variant, "seed": seed})
                continue
            study.enqueue_trial({"variant": variant, "seed": seed})
            trial = study.ask()
            trial.suggest_categorical("variant", list(spec.variant_overrides()))
            trial.suggest_categorical("seed", spec.seeds)
            trial.set_user_attr("factors", overrides)
            trial.set_user_attr("config", {"task.max_len": 5, "seed": seed, **overrides})
            if state == "RUNNING":
                continue
            if state == "FAIL":
                trial.set_user_attr("fail_reason", "TrialFailed: diverged <at step 3>")
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                continue
            if state == "PRUNED":
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                continue
            value = float(np.clip(quality + rng.normal(0, 0.03), 0, 1))
            folder = study_dir(spec.slug, runs) / "trials" / "eval" / f"{trial.number:04d}"
            write_trial_files(folder, value, positional)
            if trial.number == 0:  # kept only in the artifact store, as the harness uploads them
                artifacts = {rel: optuna.artifacts.upload_artifact(artifact_store=store, file_path=str(folder / rel),
                                                                    study_or_trial=trial)
                             for rel in ("metrics.json", "attention/probe0_test.npz")}  # fmt: skip
                trial.set_user_attr("artifacts", artifacts)
                for path in sorted(folder.rglob("*"), reverse=True):
                    path.unlink() if path.is_file() else path.rmdir()
                folder.rmdir()
            trial.set_user_attr("metrics", {spec.metric.name: value, "test/tok_acc": min(1.0, value + 0.05)})
            trial.set_user_attr("params", 20_000 if overrides.get("model.norm") == "pre" else 18_000)
            trial.set_user_attr("wall_time", 10.0 + seed)
            trial.set_user_attr("signatures", SIGNATURES)
            study.tell(trial, value)
    for params in waiting:
        study.enqueue_trial(params)
    return spec, storage, runs


_BUILT: dict[str, tuple] = {}


@pytest.fixture(scope="session")
def synthetic(tmp_path_factory):
    """The constructed study and its report, built once per session: the browser test imports this fixture
    and opens the same report (the cache is shared because both modules see this one module object)."""
    if "report" not in _BUILT:
        spec, storage, runs = synthetic_study(tmp_path_factory.mktemp("synthetic"))
        _BUILT["report"] = (spec, storage, runs, build_report(spec, storage, runs))
    return _BUILT["report"]


FIGURES = {"metric_by_variant", "metric_by_pos_encoding", "metric_by_norm", "learning_curves", "accuracy_by_length",
           "attention", "quality_vs_cost", "param_importances"}  # fmt: skip


def test_report_of_a_partial_grid_study(synthetic):
    spec, _, runs, out = synthetic
    assert (
        out
        == runs / f"script_alert_1_script_co+{hashlib.sha256(spec.name.encode()).hexdigest()[:8]}" / "report"
    )
    assert {p.stem for p in out.glob("*.png")} == FIGURES
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    assert html.count('src="data:image/png;base64,') == len(FIGURES)

    df = pd.read_csv(out / "results.csv")
    states = {"COMPLETE": 8, "FAIL": 1, "RUNNING": 1, "PRUNED": 1, "WAITING": 1}
    assert len(df) == 12 and df["state"].value_counts().to_dict() == states
    assert {"trial", "variant", "seed", "model.pos_encoding", "model.norm", "params", "wall_time", "test/seq_acc",
            "test/tok_acc", "fail_reason"} <= set(df.columns)  # fmt: skip
    waiting = df[df["state"] == "WAITING"].iloc[0]
    assert (waiting["variant"], waiting["seed"], waiting["model.norm"]) == (
        "pos_encoding=none,norm=post",
        2,
        "post",
    )

    # Partial: the banner, each state in the progress table, the failure's reason.
    assert "Partial study:** 8 of 12 grid points" in md
    assert "| pos_encoding=none,norm=pre | 4 / 4 | 1 / 3 | 1 | 1 | 0 | 0 |" in md
    assert "| pos_encoding=none,norm=post | 4 / 4 | 2 / 3 | 0 | 0 | 0 | 1 |" in md
    assert "| pos_encoding=sinusoidal,norm=pre | 4 / 4 | 2 / 3 | 0 | 0 | 1 | 0 |" in md

    results = md[md.index("## Results by variant") : md.index("## Claims")]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]]
            for line in results.splitlines() if line.startswith("| pos_")}  # fmt: skip
    assert rows["pos_encoding=sinusoidal,norm=post"][6] == "*baseline*"
    assert rows["pos_encoding=none,norm=pre"][1:3] == ["1", "3"]  # n, rank; one seed: no CI, no test
    assert rows["pos_encoding=none,norm=pre"][8] == "–"
    assert rows["pos_encoding=none,norm=post"][-1] == "0.67"  # uniform attention: AER 1 - 2/6
    assert rows["pos_encoding=sinusoidal,norm=post"][-1] == "0.00"  # attention on the gold links
    # The claim pairs both norms; norm=pre has one no-positions seed and one running: no verdict yet.
    claim = next(line for line in md.splitlines() if line.startswith("| Without positions"))
    assert "**pending**" in claim and "1 completed seed(s)" in claim and "(paired)" in claim
    assert "`train.lr` log_uniform [0.0001, 0.01]" in md


def test_report_files_follow_the_umask(tmp_path):
    # Under umask 022 a report is readable by others (classmates on a shared server), as any file is.
    spec, storage, runs = synthetic_study(tmp_path)
    umask = os.umask(0o022)
    try:
        out = build_report(spec, storage, runs)
    finally:
        os.umask(umask)
    modes = {p.name: stat.filemode(p.stat().st_mode) for p in out.iterdir()}
    assert "report.html" in modes and set(modes.values()) == {"-rw-r--r--"}, modes


def test_user_text_is_escaped(synthetic, tmp_path):
    out = synthetic[3]
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    for text in (html, md):
        assert "<script" not in text and "<b>reversal" not in text and "<em>study" not in text
        assert "<at step" not in text
        assert "TrialFailed: diverged &lt;at step 3&gt;" in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in html
    # Markdown keeps a bare "&" readable and escapes only one that would start an entity.
    assert "&lt;script&gt;alert(1)&lt;/script&gt; & co" in md
    assert md_cell("R&D: a &lt; b, &#60;") == "R&D: a &amp;lt; b, &amp;#60;"
    assert "Without positions &lt;b&gt;reversal&lt;/b&gt; fails." in html

    # Named variants are user text too; a study with no eval trial done renders its tables.
    variants = {"<img src=x onerror=alert(2)>": {"preset": "lstm"}, "b|c": {"preset": "gru"}}
    spec, storage, runs = synthetic_study(tmp_path, name="named", variants=variants,
                                          states={(v, s): "WAITING" for v in variants for s in (0, 1, 2)})  # fmt: skip
    out = build_report(spec, storage, runs)
    html, md = (out / "report.html").read_text(), (out / "report.md").read_text()
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(2)&gt;" in html
    assert "<img src=x" not in md and "| b\\|c |" in md
    assert "0 of 6 grid points" in md and "| b\\|c | 4 / 4 | 0 / 3 | 0 | 0 | 0 | 3 |" in md
    assert [p.stem for p in out.glob("*.png")] == ["param_importances"]  # tuning is all there is so far
    assert pd.read_csv(out / "results.csv")["state"].eq("WAITING").sum() == 6


def test_report_names_how_text_metrics_and_importances_were_computed(synthetic):
    md, html = (synthetic[3] / "report.md").read_text(), (synthetic[3] / "report.html").read_text()
    line = f"Text metrics, sacreBLEU signatures: bleu {SIGNATURES['bleu']}; chrf {SIGNATURES['chrf']}."
    assert f"- {line}" in md and f"<li>{line}</li>" in html
    assert "### Parameter importances (tune phase, Optuna's PED-ANOVA)" in md
    assert "Importance of each tuned parameter in the tune phase (Optuna&#39;s PED-ANOVA)." in html
    assert "fANOVA" not in md + html


def test_importances_are_ped_anova_without_scikit_learn(monkeypatch):
    """fANOVA, Optuna's default before 5.0, needs scikit-learn; PED-ANOVA, named explicitly, does not."""
    monkeypatch.setitem(sys.modules, "sklearn", None)  # importing it now fails
    distributions = {"train.lr": optuna.distributions.FloatDistribution(1e-4, 1e-2, log=True),
                     "model.dropout": optuna.distributions.FloatDistribution(0.0, 0.5)}  # fmt: skip
    rng = np.random.default_rng(0)
    trials = []
    for _ in range(20):
        params = {"train.lr": float(10 ** rng.uniform(-4, -2)), "model.dropout": float(rng.uniform(0, 0.5))}
        value = -abs(math.log10(params["train.lr"]) + 3) + 0.01 * params["model.dropout"]  # lr matters
        trials.append(optuna.create_trial(params=params, distributions=distributions, value=value))
    spec = StudySpec.model_validate({"name": "imp", "tune": {"params": {
        "train.lr": {"log_uniform": [1e-4, 1e-2]}, "model.dropout": {"uniform": [0.0, 0.5]}}, "trials": 20}})  # fmt: skip
    frame = importance_frame(SimpleNamespace(spec=spec, tune={"v": trials}))
    study = optuna.create_study(direction="maximize")
    study.add_trials(trials)
    expected = optuna.importance.get_param_importances(
        study, evaluator=importance_evaluator(), params=["train.lr", "model.dropout"]
    )
    assert dict(zip(frame["param"], frame["importance"])) == pytest.approx(expected)
    assert expected["train.lr"] > expected["model.dropout"]


def test_artifacts_come_from_the_store_or_the_trial_folder(synthetic):
    spec, storage, runs, _ = synthetic
    trials = {t.number: t for t in collect.eval_trials(spec, storage)}
    store = collect.open_artifact_store(spec, runs, None)
    from_store = collect.read_artifacts(trials[0], spec, runs, store)
    assert not (study_dir(spec.slug, runs) / "trials" / "eval" / "0000").exists()
    from_folder = collect.read_artifacts(trials[1], spec, runs, store)
    for art in (from_store, from_folder):
        assert [row["step"] for row in art.history] == [10, 20, 30]
        assert [row["length"] for row in art.per_length] == [2, 3, 4, 5, 6, 7]
        assert len(art.attention) == 1 and art.attention[0].weights["cross"].shape == (2, 2, 4, 4)
    # A trial whose files are gone entirely still has its row; it only draws nothing.
    elsewhere = runs.parent / "elsewhere"
    missing = collect.read_artifacts(
        trials[1], spec, elsewhere, collect.open_artifact_store(spec, elsewhere, None)
    )
    assert (missing.history, missing.per_length, missing.attention) == ([], [], [])


def test_summary_run_goes_to_the_study_group(synthetic, tmp_path):
    spec, storage, runs, out = synthetic
    summary = variant_summary(collect.collect(spec, storage, runs))
    log_summary_run(spec, summary, out, ["attention", "metric_by_variant"], "offline", tmp_path)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    logged = {p.name for p in (run_dir / "files").rglob("*") if p.is_file()}
    assert "report.html" in logged
    assert any(n.startswith("attention") and n.endswith(".png") for n in logged)
    assert any(n.startswith("variants") and n.endswith(".table.json") for n in logged)


def run_tiny_study(tmp_path: Path, tree: dict) -> tuple[StudySpec, object, Path]:
    """The study `tree` describes, run to the end by one worker in this process: (spec, storage, runs)."""
    runs = tmp_path / "runs"
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    spec = prepare_study(StudySpec.model_validate(tree), storage)
    run_worker(spec, storage, runs, "disabled")
    return spec, storage, runs


def test_report_of_a_tiny_real_study(tmp_path):
    spec, storage, runs = run_tiny_study(tmp_path, {
        "name": "tiny-real", "seeds": [0],
        "base": {"task": {**TINY_TASK, "test_max_len": 7}, "model": TINY_MODEL, "train": {**TINY_TRAIN, "max_steps": 2}},
        "variants": {"bahdanau": {"preset": "lstm-bahdanau"}, "transformer": {"preset": "transformer"}},
        "metric": {"name": "test/tok_acc"},
    })  # fmt: skip
    # The trial folders go: the report reads the artifact store.
    for folder in (study_dir(spec.slug, runs) / "trials" / "eval").iterdir():
        for path in sorted(folder.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
    out = build_report(spec, storage, runs)
    df = pd.read_csv(out / "results.csv")
    assert sorted(df["variant"]) == ["bahdanau", "transformer"] and (df["state"] == "COMPLETE").all()
    assert df["params"].gt(0).all() and df["wall_time"].gt(0).all() and df["test/tok_acc"].between(0, 1).all()
    assert df["tokens_per_sec"].gt(0).all() and df["steps"].eq(2).all()  # cost from the trials' metrics.json
    assert {p.stem for p in out.glob("*.png")} >= {"metric_by_variant", "learning_curves", "accuracy_by_length",
                                                   "attention", "quality_vs_cost"}  # fmt: skip
    md = (out / "report.md").read_text()
    results = md[md.index("## Results by variant") : md.index("## Claims")]
    rows = [line for line in results.splitlines() if line.startswith(("| bahdanau |", "| transformer |"))]
    assert len(rows) == 2 and all(float(row.split("|")[-2]) <= 1 for row in rows)  # a probe AER for both


def test_report_of_a_tiny_text_study_draws_bleu_by_length_and_pairs_seeds(tmp_path):
    spec, storage, runs = run_tiny_study(tmp_path, {
        "name": "tiny-text", "seeds": [0, 1], "baseline": "bahdanau",
        "base": {"task": {**TINY_TASK, "name": "synth_mt", "min_len": 5, "max_len": 6, "test_max_len": 8},
                 "model": TINY_MODEL, "train": {**TINY_TRAIN, "max_steps": 2}},
        "variants": {"bahdanau": {"preset": "lstm-bahdanau"}, "none": {"preset": "lstm"}},
        "metric": {"name": "test/bleu"},
    })  # fmt: skip
    out = build_report(spec, storage, runs)
    assert (out / "bleu_by_length.png").is_file()
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    table = md[md.index("## BLEU, paired over test sentences") : md.index("## Figures")]
    rows = [line.split("|")[1:-1] for line in table.splitlines() if line.startswith("| none |")]
    assert [[cell.strip() for cell in row[1:3]] for row in rows] == [["test", "0, 1"], ["test_long", "0, 1"]]
    assert all(len(row[-1].split(",")) == 2 for row in rows)  # a p-value per seed pair
    assert "paired bootstrap resampling (Koehn 2004) with 1000 resamples" in md
    assert 'id="paired-table"' in html and "Bahdanau et al. (2015, Fig. 2)" in html


def test_bleu_by_length_draws_every_seed_inside_0_100():
    from matplotlib.collections import PathCollection, PolyCollection

    references = ["the cat sat on the mat today", "a dog ran in the park all day", "it is raining on us now"]
    references *= 27  # 81 sentences a trial: 20 of each length 5, 15, 25, 35, and one of length 95
    rng = np.random.default_rng(0)
    rows = []
    for trial, (variant, seed) in enumerate((v, s) for v in ("a", "b") for s in (0, 1, 2)):
        for i, ref in enumerate(references):
            words = ref.split()
            kept = words if rng.random() < (0.9 if variant == "a" else 0.3) else words[: len(words) // 2]
            length = 95 if i == 80 else 5 + 10 * (i % 4)
            rows.append({"trial": trial, "variant": variant, "seed": seed, "split": "test" if length < 20 else
                         "test_long", "src_len": length, "hyp": " ".join(kept), "ref": ref})  # fmt: skip
    translations = pd.DataFrame(rows)
    table = plots.length_bleu(translations)
    # The lone sentence of length 95 joins the 30-39 bucket: no bucket rests on fewer than 20 sentences.
    assert sorted(table["length_min"].unique()) == [0, 10, 20, 30] and table["n"].sum() == 6 * 81
    ax = plots.bleu_by_length(translations, ["a", "b"], max_tokens=15).axes[0]
    bands = [c.get_paths()[0].vertices[:, 1] for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 2 and all(((b >= 0) & (b <= 100)).all() for b in bands)  # one a variant
    assert len(ax.patches) == 1 and ax.patches[0].get_x() == 15.5  # shaded: sources beyond max_tokens
    points = sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))
    assert points == len(table)  # every seed's BLEU in every bucket
    assert ax.get_ylim()[0] == 0 and ax.get_ylim()[1] <= 100
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0-9", "10-19", "20-29", "30-99"]
    assert plots.bleu_by_length(pd.DataFrame(), ["a"], None) is None
    plots.plt.close("all")


def test_the_shaded_lengths_start_past_max_len_or_a_corpus_max_tokens():
    def study(*configs):
        return SimpleNamespace(configs=dict(enumerate(configs)))

    assert train_max_len(study({"task.name": "reverse", "task.max_len": 5}, {"task.max_len": 8})) == 8
    # A corpus task trains on pairs of up to task.max_tokens; its task.max_len is an unused default.
    assert train_max_len(study({"task.name": "bible", "task.max_len": 10, "task.max_tokens": 24})) == 24
    assert train_max_len(study({"task.name": "parallel", "task.max_len": 10, "task.max_tokens": None})) is None


def test_figure_error_bars_are_the_table_cis():
    seeds = {"a": [0.8, 0.84, 0.9], "b": [0.5, 0.6], "c": [0.3]}
    df = pd.DataFrame([{"trial": 0, "variant": v, "seed": i, "state": "COMPLETE", "test/seq_acc": x}
                       for v, xs in seeds.items() for i, x in enumerate(xs)])  # fmt: skip
    summary = stats.summarize(df, "test/seq_acc", list(seeds), "a").set_index("variant")
    ax = plots.metric_by_variant(df, "test/seq_acc", list(seeds)).axes[0]
    bars = [line.get_ydata() for line in ax.lines[1:]]  # the means' line, then one error bar (with caps) each
    for variant, bar in zip(seeds, bars[:2]):
        assert (np.nanmin(bar), np.nanmax(bar)) == pytest.approx(
            tuple(summary.loc[variant, ["ci_low", "ci_high"]])
        )
    assert np.isnan(bars[2]).all()  # one seed: the mean alone
    plots.plt.close("all")


def test_figure_bands_and_bars_stay_inside_the_metric_range():
    """Seeds near 1 (where a t-band crosses 1) and losses near 0 (where it goes negative): every band and
    error bar stays in range, the accuracy axis spans [0, 1], and each seed is drawn as a point."""
    from matplotlib.collections import PathCollection, PolyCollection

    seeds = [("a", 1.0), ("a", 0.9), ("b", 0.02), ("b", 0.0), ("b", 0.0)]
    trials = pd.DataFrame([{"trial": t, "variant": v, "seed": t, "state": "COMPLETE", "test/seq_acc": x,
                            "examples/valid": 300, "examples/test": 500} for t, (v, x) in enumerate(seeds)])  # fmt: skip
    history = pd.DataFrame([{"trial": t, "variant": v, "seed": t, "step": step, "val/seq_acc": x * step / 2,
                             "val/loss": (1 - x) / step} for t, (v, x) in enumerate(seeds) for step in (1, 2)])  # fmt: skip
    accuracy, loss = plots.learning_curves(history, ["val/seq_acc", "val/loss"], ["a", "b"], trials).axes
    for ax, (low, high) in ((accuracy, (0, 1)), (loss, (0, np.inf))):
        bands = [c.get_paths()[0].vertices[:, 1] for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(bands) == 2 and all(((b >= low) & (b <= high)).all() for b in bands)
        points = sum(len(c.get_offsets()) for c in ax.collections if isinstance(c, PathCollection))
        assert points == len(history)  # one point per seed and step
    assert accuracy.get_ylim()[0] < 0 and accuracy.get_ylim()[1] > 1
    # The loss axis starts at 0 and ends at 1.5 x the largest seed's loss (1 - 0 at step 1): two seeds give a
    # log-scale band far above the curves, which the axis clips instead of squashing them.
    assert loss.get_ylim() == pytest.approx((0, 1.5))
    for ax in (accuracy, loss):  # no band runs off its axis
        bottom, top = ax.get_ylim()
        assert all(bottom <= c.get_paths()[0].vertices[:, 1].min() and c.get_paths()[0].vertices[:, 1].max() <= top
                   for c in ax.collections if isinstance(c, PolyCollection))  # fmt: skip
    ax = plots.metric_by_variant(trials, "test/seq_acc", ["a", "b"]).axes[0]
    bars = np.concatenate([line.get_ydata() for line in ax.lines[1:]])
    assert np.nanmin(bars) >= 0 and np.nanmax(bars) <= 1 and ax.get_ylim()[0] < 0 < 1 < ax.get_ylim()[1]
    assert sum(len(c.get_offsets()) for c in ax.collections) == len(trials)  # one point per seed
    plots.plt.close("all")


def test_the_report_opens_with_its_result_and_each_claims_verdict(synthetic):
    spec, storage, runs, out = synthetic
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    summary = variant_summary(collect.collect(spec, storage, runs)).sort_values("rank")
    best, runner_up = summary["variant"].iloc[:2]
    opening = md[: md.index("## Results by variant")]
    assert opening.index("**Compared:**") < opening.index("**Result:**") < opening.index("**Claims:**")
    assert f"**Result:** {best} scores {summary['mean'].iloc[0]:.3f}" in opening
    assert f"ahead of the runner-up {runner_up}" in opening
    assert "> | Without positions &lt;b&gt;reversal&lt;/b&gt; fails | **pending** | Δ = " in opening
    assert html.index('id="headline"') < html.index('id="summary"')


def test_the_report_counts_and_shows_tests_and_checks_apart(tmp_path):
    # A check first in the study file: the report still puts the test first, each kind in its own table,
    # and the headline carries the test's confounds.
    check = {**CLAIM, "text": "Without positions a set cannot be reversed.", "kind": "check"}
    test = {**CLAIM, "compare": {"model.norm": "pre"}, "to": {"model.norm": "post"}, "expect": "higher",
            "margin": 0.0, "text": "Pre-LN <i>beats</i> post-LN.", "confounds": "one <i>task</i>",
            "revised": "margin 0.1 -> 0 after the first run"}  # fmt: skip
    spec, storage, runs = synthetic_study(tmp_path, keys={"factors": GRID, "claims": [check, test]})
    out = build_report(spec, storage, runs)
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    # A claim revised after a run is marked, and its verdict counted apart from those fixed before it.
    tally = ("1 test of a published finding: none fixed before a run (1 revised after a run: 1 pending); "
             "1 check of a mechanism: 1 pending")  # fmt: skip
    assert md.count("Revised after a run: margin 0.1 -&gt; 0 after the first run") == 2  # headline, table
    assert html.count("Revised after a run: margin 0.1 -&gt; 0 after the first run") == 2
    opening = md[: md.index("## Results by variant")].splitlines()
    rows = [line for line in opening if line.startswith("> | ")]
    assert f"> **Claims:** {tally}." in opening
    assert [row.split(" | ")[1:3] for row in rows] == [
        ["test", "verdict"],
        ["Pre-LN &lt;i&gt;beats&lt;/i&gt; post-LN (Revised after a run: margin 0.1 -&gt; 0 after the first run)",
         "**pending**"],
        ["check", "verdict"], ["Without positions a set cannot be reversed", "**pending**"],
    ]  # fmt: skip
    assert rows[1].endswith(" | one &lt;i&gt;task&lt;/i&gt; |") and rows[3].endswith(" | – |")
    claims = md[md.index("## Claims") : md.index("## Figures")]
    order = [f"{tally}.", "### Tests of published findings", "| Pre-LN &lt;i&gt;beats",
             "### Checks of mechanisms (true by construction", "| Without positions a set"]  # fmt: skip
    assert [claims.index(text) for text in order] == sorted(claims.index(text) for text in order)
    headline, claims = html[: html.index('id="summary"')], html[html.index('id="claims"') :]
    assert '<td class="text">one &lt;i&gt;task&lt;/i&gt;</td>' in headline
    order = ['id="claims-table"', "Pre-LN &lt;i&gt;beats", 'id="checks-table"', "Without positions a set"]
    assert [claims.index(text) for text in order] == sorted(claims.index(text) for text in order)
    note = optuna_dashboard.get_note(optuna.load_study(study_name=optuna_study_name(spec), storage=storage))
    assert note.index("#### Tests of published findings") < note.index("#### Checks of mechanisms")


def test_the_headline_says_how_sure_the_winner_is():
    spec = SimpleNamespace(
        metric=SimpleNamespace(name="test/score", direction="maximize")
    )  # unbounded: Welch

    def winner(values: dict[str, list[float]]) -> str:
        df = pd.DataFrame([{"trial": 0, "variant": v, "seed": i, "state": "COMPLETE", "test/score": x}
                           for v, xs in values.items() for i, x in enumerate(xs)])  # fmt: skip
        summary = stats.summarize(df, "test/score", list(values), next(iter(values)))
        return headline.winner(SimpleNamespace(spec=spec, trials=df), summary)

    a, b = [5.0, 6.0, 7.0], [1.0, 2.0, 3.5]
    welch = sps.ttest_ind(a, b, equal_var=False)
    ci = welch.confidence_interval(0.95)
    assert winner({"b": b, "a": a}) == (
        f"a scores 6.000 (95% CI [{stats.mean_ci(np.array(a))[0]:.3f}, {stats.mean_ci(np.array(a))[1]:.3f}]), "
        f"ahead of the runner-up b (2.167) by Δ = 3.833 (95% CI [{ci.low:.3f}, {ci.high:.3f}], "
        f"p = {welch.pvalue:.3f}); the CI excludes 0."
    )
    assert winner({"b": [1.0, 3.0], "a": [1.5, 3.0]}).endswith(
        "the CI includes 0: not distinguishable at these seeds."
    )
    assert winner({"b": [1.0], "a": [2.0, 3.0]}).endswith("by Δ = 1.500 (no CI (one seed)).")


def test_no_row_pairs_a_ci_that_excludes_0_with_p_above_005_unexplained(synthetic):
    md = (synthetic[3] / "report.md").read_text()
    results = md[md.index("## Results by variant") : md.index("## Claims")]
    header = [
        c.strip()
        for c in next(line for line in results.splitlines() if line.startswith("| variant")).split("|")
    ]
    ci, p = header.index("95% CI of Δ"), header.index("p")
    tested = 0
    for line in results.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if line.startswith("| pos_") and cells[p] != "–":
            lo, hi = map(float, cells[ci].strip("[]").split(", "))
            assert (lo > 0 or hi < 0) == (cells[p] == "<0.001" or float(cells[p]) < 0.05)
            tested += 1
    assert tested >= 2
    # Holm can differ from the CI, and says why; at 2 and 3 seeds the permutation test cannot reach 0.05.
    assert "so a CI that excludes 0 may sit beside a Holm p above 0.05" in results
    assert "p (perm.)" not in header and "Permutation test not shown: at these seeds its smallest" in results


def test_attention_grid_has_one_colour_bar():
    fig = plots.attention_maps({"a": [attention_sample(True)], "b": [attention_sample(False)]})
    panels, (bar,) = fig.axes[:2], fig.axes[2:]
    assert all(ax.images for ax in panels) and bar.get_ylabel() == "attention weight"
    assert bar.get_ylim() == (0.0, 1.0)
    plots.plt.close("all")


def test_figures_skip_what_has_no_data():
    no_trials = pd.DataFrame(columns=["trial", "variant", "seed", "state", "test/seq_acc"])
    failed = pd.DataFrame(
        [{"trial": 0, "variant": "a", "seed": 0, "state": "FAIL", "test/seq_acc": math.nan}]
    )
    for df in (no_trials, failed):
        assert plots.metric_by_variant(df, "test/seq_acc", ["a"]) is None
        assert plots.metric_by_factor(df, "test/seq_acc", "model.norm", []) is None
    assert plots.learning_curves(pd.DataFrame(), ["val/seq_acc"], ["a"], no_trials) is None
    assert plots.accuracy_by_length(pd.DataFrame(), ["a"], 5) is None
    # An LSTM without attention has no cross-attention map to draw or score.
    no_attention = AttentionSample("test", SRC, ["<s>", *TGT[:-1]], TGT, {}, ALIGNMENT)
    assert plots.attention_maps({"lstm": [no_attention]}) is None and math.isnan(
        plots.probe_aer(no_attention)
    )
    assert plots.probe_aer(attention_sample(aligned=True)) == 0.0


def test_reports_and_analysis_import_neither_torch_nor_lightning():
    """Building a report, or judging claims at a look, reads arrays and tables only; torch and Lightning
    would add seconds to every `ablate report`. Every module of reports/ and analysis/, imported in a fresh
    interpreter."""
    import pkgutil
    import subprocess
    import sys

    from ablate import analysis, reports

    modules = sorted(f"{package.__name__}.{m.name}" for package in (analysis, reports)
                     for m in pkgutil.iter_modules(package.__path__))  # fmt: skip
    expected = ["analysis.table", "analysis.stats", "analysis.claims", "reports.collect", "reports.plots",
                "reports.render"]  # fmt: skip
    assert {f"ablate.{name}" for name in expected} <= set(modules)
    check = (f"import sys, {', '.join(modules)}; "
             "loaded = [m for m in ('torch', 'lightning') if m in sys.modules]; "
             "assert not loaded, f'imported {loaded}'")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_study_spec_reads_without_optuna():
    """The study file is validated before the storage is touched: the spec module needs no Optuna."""
    import subprocess
    import sys

    check = "import sys, ablate.schema.spec; assert 'optuna' not in sys.modules, 'optuna imported'"
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_report_says_why_one_arm_was_tuned_for_all(tmp_path):
    why = "the paper keeps the <i>baseline's</i> rate for every arm"
    tune = {"params": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, "trials": 4, "arm": "baseline", "why": why}
    keys = {"tune": tune, "baseline": {"model.pos_encoding": "sinusoidal", "model.norm": "post"}}
    spec, storage, runs = synthetic_study(tmp_path, keys=keys)
    out = build_report(spec, storage, runs)
    said = "Tuning: on the baseline alone, its parameters used by every arm: the paper keeps the &lt;i&gt;"
    assert said in (out / "report.md").read_text() and said in (out / "report.html").read_text()
