"""The study in optuna-dashboard: objectives named after their metrics, the report's tables and claim
verdicts as the study note, a note per trial, the report's figures as plotly graphs with the tables' numbers,
a heatmap PNG per probe; then a real tiny study served by `ablate dashboard` and read in headless Chromium."""

from __future__ import annotations

import html
import json
import math
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request

import numpy as np
import optuna
import optuna_dashboard
import pandas as pd
import pytest
import yaml
from conftest import TINY_MODEL, TINY_TASK, TINY_TRAIN, ablate, ablate_exe
from matplotlib import image
from matplotlib.collections import PolyCollection
from test_report_browser import CHROMIUM, chromium
from test_reports import SRC, attention_sample, synthetic  # noqa: F401  (the session's report)
from typer.testing import CliRunner

from ablate.analysis import claims, stats
from ablate.cli import app
from ablate.harness.artifacts import AttentionSample
from ablate.harness.attention_maps import save_probe_image
from ablate.harness.study.queue import prepare_study
from ablate.harness.study.storage import open_storage
from ablate.reports import collect, dashboard, plots
from ablate.reports.render import build_report, variant_summary
from ablate.schema.spec import StudySpec
from ablate.schema.trials import optuna_study_name

METRIC = "test/seq_acc"


def cells(note: str, first: str) -> list[str]:
    """The cells of the Markdown table row that starts with `first`."""
    line = next(line for line in note.splitlines() if line.startswith(f"| {first}"))
    return [cell.strip() for cell in line.split("|")[1:-1]]


def test_study_note_holds_the_reports_table_and_verdicts(synthetic):  # noqa: F811
    spec, storage, runs, _ = synthetic
    study = optuna.load_study(study_name=optuna_study_name(spec), storage=storage)
    note = optuna_dashboard.get_note(study)
    data = collect.collect(spec, storage, runs)
    summary = variant_summary(data).set_index("variant")
    baseline = spec.baseline_variant()
    done = data.trials[(data.trials["state"] == "COMPLETE") & (data.trials["variant"] == baseline)]
    assert cells(note, baseline)[:3] == [baseline, "3", f"{done[METRIC].mean():.3f}"]
    for variant, row in summary.iterrows():
        n, mean, ci = cells(note, variant)[1:4]
        assert (n, mean) == (str(row["n"]), f"{row['mean']:.3f}")
        one_seed = math.isnan(row["ci_low"])  # one seed gives no interval
        assert ci == ("[–, –]" if one_seed else f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]")
    (result,) = claims.evaluate_all(spec, data.trials)
    claim = cells(note, "Without positions")
    assert claim[1:4] == [
        f"**{result.verdict}**",
        f"{result.diff:.3f}",
        "[–, –]",  # a side with one seed: no interval
    ]
    assert math.isnan(result.ci_low) and math.isnan(result.ci_high)
    assert claim[-1] == "a variant has 1 completed seed(s) of test/seq_acc; a verdict needs 3"
    assert "<b>" not in note and "Without positions &lt;b&gt;reversal&lt;/b&gt; fails." in note

    notes = {t.number: optuna_dashboard.get_note(optuna.Trial(study, t._trial_id)) for t in study.trials}
    failed = data.trials[data.trials["state"] == "FAIL"].iloc[0]
    assert notes[failed["trial"]].splitlines()[::2] == [
        "**pos_encoding=none,norm=pre**, seed 0: fail", "Failed: TrialFailed: diverged &lt;at step 3&gt;"
    ]  # fmt: skip
    for row in data.trials[data.trials["state"] == "COMPLETE"].to_dict("records"):
        assert notes[row["trial"]].splitlines()[::2] == [
            f"**{row['variant']}**, seed {row['seed']}: complete", f"`{METRIC}` = {row[METRIC]:.4f}"
        ]  # fmt: skip

    # The figures, by their ids; each rebuilt at every report.
    graphs = {key.split(":")[2] for key in storage.get_study_system_attrs(study._study_id)
              if key.startswith("dashboard:plot_data:")}  # fmt: skip
    assert graphs == {"metric_by_variant", "accuracy_by_length"}


def test_building_the_report_rewrites_an_edited_note_and_leaves_an_unchanged_one(synthetic):  # noqa: F811
    spec, storage, runs, _ = synthetic
    study = optuna.load_study(study_name=optuna_study_name(spec), storage=storage)
    written = optuna_dashboard.get_note(study)
    optuna_dashboard.save_note(study, "edited by hand")
    build_report(spec, storage, runs)
    assert optuna_dashboard.get_note(study) == written
    version = storage.get_study_system_attrs(study._study_id)["dashboard:note_ver"]
    data = collect.collect(spec, storage, runs)
    dashboard.publish(data, variant_summary(data), written, {}, storage, None)
    assert storage.get_study_system_attrs(study._study_id)["dashboard:note_ver"] == version  # no new version


def test_metric_by_variant_draws_every_seed_and_the_tables_ci():
    seeds = {"a": [0.8, 0.84, 0.9], "b": [0.5, 0.6], "c": [0.3]}
    done = [{"trial": 10 * i + j, "variant": v, "seed": j, "state": "COMPLETE", METRIC: x}
            for i, (v, xs) in enumerate(seeds.items()) for j, x in enumerate(xs)]  # fmt: skip
    df = pd.DataFrame([*done, {"trial": 99, "variant": "b", "seed": 5, "state": "FAIL", METRIC: np.nan}])
    summary = stats.summarize(df, METRIC, list(seeds), "a")
    figure = dashboard.metric_by_variant(df, summary, METRIC, list(seeds))
    points, means = figure.data
    assert sorted(zip(points.x, points.y)) == sorted((v, x) for v, xs in seeds.items() for x in xs)
    assert list(means.x) == list(seeds) and means.y == pytest.approx([0.8466667, 0.55, 0.3])
    top = np.array(means.y) + np.array(means.error_y.array, dtype=float)
    bottom = np.array(means.y) - np.array(means.error_y.arrayminus, dtype=float)
    assert top[:2] == pytest.approx(summary["ci_high"][:2]) and bottom[:2] == pytest.approx(
        summary["ci_low"][:2]
    )
    assert list(figure.layout.yaxis.range) == pytest.approx([-0.04, 1.04])  # accuracy's whole range
    empty = df.assign(state="FAIL")
    assert dashboard.metric_by_variant(empty, summary, METRIC, list(seeds)) is None


def test_accuracy_by_length_merges_splits_by_examples_then_averages_seeds():
    rows = [
        # trial 0 (seed 0): length 2 in both splits, 10 and 30 examples: (0.5 * 10 + 0.1 * 30) / 40 = 0.2
        (0, 0, "test", 2, 10, 0.5), (0, 0, "test_long", 2, 30, 0.1), (0, 0, "test_long", 6, 10, 0.2),
        (1, 1, "test", 2, 10, 0.7), (1, 1, "test_long", 6, 10, 0.4),
    ]  # fmt: skip
    per_length = pd.DataFrame(
        [{"trial": t, "variant": "a", "seed": s, "split": sp, "length": n, "n": k, "seq_acc": x}
         for t, s, sp, n, k, x in rows]
    )  # fmt: skip
    curves = dashboard.length_curves(plots.length_accuracy(per_length), ["a"]).set_index("length")
    assert curves["mean"].to_dict() == pytest.approx({2: 0.45, 6: 0.3})
    # The interval in [0, 1], at the fewest examples of a seed at that length (10: trial 1).
    ci = stats.mean_ci(np.array([0.2, 0.7]), stats.metric_range(METRIC), 10)
    assert tuple(curves.loc[2, ["ci_low", "ci_high"]]) == pytest.approx(ci)
    fig = dashboard.accuracy_by_length(per_length, ["a"], train_max_len=4)
    curve, seeds = fig.data
    assert list(curve.x) == [2, 6] and list(curve.y) == pytest.approx([0.45, 0.3])
    # Each seed a point, as in the report's figure.
    assert np.ravel(sorted(zip(seeds.x, seeds.y))) == pytest.approx([2, 0.2, 2, 0.7, 6, 0.2, 6, 0.4])
    (beyond,) = fig.layout.shapes  # the lengths beyond training: 5 and 6
    assert (beyond.x0, beyond.x1) == (4.5, 6.5)
    assert dashboard.accuracy_by_length(per_length.iloc[0:0], ["a"], 4) is None


def test_dashboard_and_report_draw_the_same_bounded_length_intervals():
    # Two seeds a length: both at 0 (length 9), near 1 (length 3), spread wide (length 6); 40 examples each.
    acc = {3: (1.0, 0.95), 6: (0.1, 0.9), 9: (0.0, 0.0)}
    per_length = pd.DataFrame(
        [{"trial": s, "variant": "a", "seed": s, "split": "test", "length": n, "n": 40, "seq_acc": x[s]}
         for n, x in acc.items() for s in (0, 1)]
    )  # fmt: skip
    curve = dashboard.accuracy_by_length(per_length, ["a"], None).data[0]
    dash_lo = np.array(curve.y) - np.array(curve.error_y.arrayminus, dtype=float)
    dash_hi = np.array(curve.y) + np.array(curve.error_y.array, dtype=float)
    ax = plots.accuracy_by_length(per_length, ["a"], None).axes[0]
    (line,) = [line for line in ax.get_lines() if line.get_label() == "a"]
    (band,) = [c for c in ax.collections if isinstance(c, PolyCollection)]
    vertices = band.get_paths()[0].vertices
    report_band = [
        (vertices[vertices[:, 0] == x, 1].min(), vertices[vertices[:, 0] == x, 1].max()) for x in acc
    ]
    assert list(line.get_xdata()) == list(curve.x) == list(acc)
    assert list(line.get_ydata()) == pytest.approx(list(curve.y))
    assert list(curve.y) == pytest.approx([0.975, 0.5, 0.0])
    assert np.ravel(report_band) == pytest.approx(np.ravel(list(zip(dash_lo, dash_hi))), abs=1e-12)
    for (lo, hi), x in zip(report_band, acc.values()):
        assert (lo, hi) == pytest.approx(stats.mean_ci(np.array(x), stats.metric_range(METRIC), 40))
        assert 0 <= lo <= np.mean(x) <= hi <= 1
    assert dash_lo[2] == 0 < dash_hi[2]  # seeds all at 0: a point at 0 with the binomial width of 80 examples


def test_probe_heatmap_png_marks_the_gold_links(tmp_path):
    path = tmp_path / "probe0_test.png"
    assert save_probe_image(attention_sample(aligned=True), path)
    pixels = image.imread(path)[..., :3]
    assert pixels.shape[1] > 200 and pixels.std() > 0.05
    red = (pixels[..., 0] > 0.8) & (pixels[..., 1] < 0.2) & (pixels[..., 2] < 0.2)
    assert red.sum() > 30  # the three gold squares' outlines
    # A panel per kind of attention the model has (one here, two with decoder self-attention too); none at
    # all draws nothing.
    aligned = attention_sample(aligned=True)
    aligned.weights["decoder"] = np.full((1, 2, 4, 4), 0.25)
    assert save_probe_image(aligned, tmp_path / "two.png")
    assert image.imread(tmp_path / "two.png").shape[1] == 2 * pixels.shape[1]
    assert not save_probe_image(AttentionSample("test", SRC, ["<s>"], ["</s>"]), tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_objectives_carry_the_metrics_names_and_seeds_are_no_parameters(tmp_path):
    spec = StudySpec.model_validate({
        "name": "named", "base": {"preset": "transformer", "task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "variants": {"a": {}, "b": {"model.norm": "pre"}}, "seeds": [0, 1], "metric": {"name": "test/tok_acc"},
        "tune": {"params": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, "trials": 2},
    })  # fmt: skip
    storage = open_storage(f"sqlite:///{tmp_path / 'study.db'}")
    prepare_study(spec, storage)
    evaluation = optuna.load_study(study_name="named:eval", storage=storage)
    assert evaluation.metric_names == ["test/tok_acc"]
    for variant in ("a", "b"):
        tune = optuna.load_study(study_name=f"named:tune:{variant}", storage=storage)
        assert tune.metric_names == ["val/tok_acc"]
    queued = evaluation.get_trials()
    assert sorted((t.system_attrs["fixed_params"]["variant"], t.user_attrs["seed"]) for t in queued) == [
        ("a", 0), ("a", 1), ("b", 0), ("b", 1)
    ]  # fmt: skip
    assert all("seed" not in t.system_attrs["fixed_params"] for t in queued)


BAD_PORTS = ["0", "-1", "65536", "99999", str(2**64), "inf", "nan", "80.5", "8e3", "0x50", "http", ""]
BAD_HOSTS = ["", "a b", "[::1]", "host/x", "127.0.0.1:80", "::1::2", "é\n"]


def dry_run(tmp_path, *args: str):
    """`ablate dashboard tiny --dry-run` on a study's storage: a value let through is printed, not served."""
    runs = tmp_path / "runs"
    if not (runs / "tiny").exists():
        (runs / "tiny").mkdir(parents=True)
        optuna.create_study(study_name="tiny:eval", storage=f"sqlite:///{runs / 'tiny' / 'study.db'}")
    return CliRunner().invoke(app, ["dashboard", "tiny", "--out", str(runs), *args, "--dry-run"])


@pytest.mark.parametrize(
    "option, value", [*(("--port", p) for p in BAD_PORTS), *(("--host", h) for h in BAD_HOSTS)]
)
def test_a_port_or_host_no_server_binds_is_one_line_before_anything_opens(tmp_path, option, value):
    result = dry_run(tmp_path, option, value)
    assert result.exit_code == 2, (result.output, result.exception)
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {option}: ")


def test_the_ends_of_the_port_range_and_every_kind_of_host_are_taken(tmp_path):
    for host, port in (("::1", "65535"), ("localhost", "1"), ("0.0.0.0", "8080")):
        result = dry_run(tmp_path, "--host", host, "--port", port)
        assert result.exit_code == 0 and f"http://{host}:{port}:" in result.stdout, result.output


# The page as a browser shows it ---------------------------------------------------------------------------


def page(tmp_path, url: str) -> tuple[str, str]:
    """A dashboard page once the app has fetched and drawn: its DOM, and its text (tags removed)."""
    proc = chromium(tmp_path, "--virtual-time-budget=20000", "--dump-dom", url)
    assert proc.returncode == 0, proc.stderr[-2000:]
    body = re.sub(r"<(script|style)\b.*?</\1>", " ", proc.stdout, flags=re.S)
    return proc.stdout, re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", body)))


def get_json(url: str):
    return json.loads(urllib.request.urlopen(url, timeout=5).read().decode())


@pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install -y chromium)"
)
def test_dashboard_shows_the_objective_and_the_claim_verdicts(tmp_path):
    study_file = tmp_path / "tiny.yaml"
    study_file.write_text(yaml.safe_dump({
        "name": "tiny-dash", "seeds": [0], "metric": {"name": "test/tok_acc"},
        "base": {"task": TINY_TASK, "model": TINY_MODEL, "train": TINY_TRAIN},
        "variants": {"bahdanau": {"preset": "lstm-bahdanau"}, "transformer": {"preset": "transformer"}},
        "claims": [{"text": "Transformers reverse like attention LSTMs.", "compare": {"preset": "transformer"},
                    "to": {"preset": "lstm-bahdanau"}, "expect": "similar", "margin": 0.5}],
    }))  # fmt: skip
    runs = tmp_path / "runs"
    # One worker runs the whole study, so it finishes the last trial and writes the report (and the note).
    proc = ablate("worker", str(study_file), "--out", str(runs), "--wandb", "disabled")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "report: " in proc.stderr and (runs / "tiny-dash" / "report" / "report.html").is_file()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = ablate_exe()
    server = subprocess.Popen([exe, "dashboard", "tiny-dash", "--out", str(runs), "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, studies = time.monotonic() + 60, None
        while studies is None and time.monotonic() < deadline:
            try:
                studies = get_json(f"{base}/api/studies")["study_summaries"]
            except OSError:
                time.sleep(0.5)
        (study_id,) = [s["study_id"] for s in studies if s["study_name"] == "tiny-dash:eval"]
        # Importance is over the variant alone: the seed is no parameter.
        (importances,) = get_json(f"{base}/api/studies/{study_id}/param_importances")["param_importances"]
        assert [i["name"] for i in importances] == ["variant"]

        _, history = page(tmp_path, f"{base}/dashboard/studies/{study_id}")
        assert "test/tok_acc" in history and "Objective 0" not in history
        assert "Intermediate values" in history and "test/tok_acc per variant" in history
        _, note = page(tmp_path, f"{base}/dashboard/studies/{study_id}/note")
        verdict = re.search(r"Transformers reverse like attention LSTMs\. (\S+)", note)
        assert verdict and verdict.group(1) == "inconclusive", note[:3000]
        assert "a variant has 1 completed seed(s) of test/tok_acc" in note
        dom, trial = page(tmp_path, f"{base}/dashboard/studies/{study_id}/trials?numbers=1")
        assert "transformer , seed 0: complete" in trial
        # The probes' heatmaps are images on the trial's page, not file icons.
        assert len(re.findall(r'<img [^>]*alt="probe\d_test(_long)?\.png" src="/artifacts/', dom)) == 3
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # ablate and the optuna-dashboard it started
        server.wait(timeout=30)
