"""The dashboard's pure parts: filter semantics, the prior matrices, the sensitivity slice, and the launcher's
command line (loopback by default, issue 7)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from dashboard import RESULTS_ENV, charts, context, export, importance, launch, metrics, prior, queries
from dashboard.queries import Filters
from orchestrator import registry
from orchestrator.cli import app


def runs_frame() -> pd.DataFrame:
    return pd.DataFrame({
        "run_id": ["a", "b", "c", "d", "e"],
        "sweep": ["s"] * 5,
        "backbone": ["RN50"] * 5,
        "dataset": ["imagenet"] * 5,
        "method": ["clip", "bca", "bca", "bca", "bca"],
        "seed": [1, 1, 2, 1, 1],
        "status": ["finished", "finished", "finished", "running", "finished"],
        "complete": [True, True, True, False, True],
        "num_templates": [1, 1, 1, 1, 1],
        "tau": [math.nan, 0.3, 0.3, 0.5, 0.5],
        "n1": [pd.NA, 30000, 30000, 30000, 1000],
        "n2": [pd.NA, 10, 10, 10, 10],
        "accuracy": [50.0, 60.0, 62.0, 55.0, 58.0],
    }).astype({"n1": "Int64", "n2": "Int64"})


def test_filters_hparams_let_runs_without_them_through() -> None:
    runs = runs_frame()
    assert Filters(tau=(0.3,)).apply(runs)["run_id"].tolist() == ["a", "b", "c"]
    assert Filters(n1=(1000,)).apply(runs)["run_id"].tolist() == ["a", "e"]
    assert Filters(method=("bca",), seed=(1,)).apply(runs)["run_id"].tolist() == ["b", "d", "e"]
    assert Filters(status=("running",)).apply(runs)["run_id"].tolist() == ["d"]
    assert Filters().apply(runs)["run_id"].tolist() == list("abcde")


def test_with_clip_adds_the_baseline_only_when_needed() -> None:
    assert Filters(method=("bca",)).with_clip().method == ("bca", "clip")
    assert Filters(method=("clip", "bca")).with_clip().method == ("clip", "bca")
    assert Filters().with_clip().method == ()


def test_series_labels_name_what_varies_within_a_method() -> None:
    runs = runs_frame()
    labels = queries.series_labels(runs, ["tau", "n1", "n2"])
    assert labels.tolist() == ["CLIP", "BCA (tau=0.3, n1=30000)", "BCA (tau=0.3, n1=30000)",
                               "BCA (tau=0.5, n1=30000)", "BCA (tau=0.5, n1=1000)"]


def test_sensitivity_holds_the_other_hparams_at_their_most_common_value() -> None:
    points, held = queries.sensitivity_points(runs_frame(), "tau", ["tau", "n1", "n2"])
    # finished bca runs with n1 = 30000 (the most common): tau 0.3 twice; the tau 0.5 one is running
    assert held == {"n1": 30000}
    assert points.empty  # a single tau value is left: nothing to plot
    runs = runs_frame().assign(status="finished", complete=True)
    points, held = queries.sensitivity_points(runs, "tau", ["tau", "n1", "n2"])
    assert held == {"n1": 30000}
    assert points[["value", "mean", "n"]].values.tolist() == [[0.3, 61.0, 2], [0.5, 55.0, 1]]
    assert set(points["series"]) == {"BCA · ImageNet"}


def test_default_window_gives_about_the_asked_points() -> None:
    assert queries.default_window(1000, points=25) == 40
    assert queries.default_window(3, points=25) == 1


def state(k: int = 4, templates: int = 2) -> dict[str, np.ndarray]:
    class_ids = np.arange(k * templates) % k
    v = np.eye(k)[class_ids].astype(np.float32)
    v[1] = [0.1, 0.6, 0.3, 0.0]  # embedding 1 (class 1, first template) moved mass to class 2
    c2 = np.full(k * templates, 10.0)
    c2[[1, 5]] = [14.0, 11.0]  # class 1: 5 updates; class 3: none; class 2 (embedding 2): 2
    c2[2] = 12.0
    return {"V": v, "class_ids": class_ids, "C2": c2}


def test_class_prior_averages_the_embeddings_of_each_class() -> None:
    s = state()
    p = prior.class_prior(s["V"], s["class_ids"])
    assert np.allclose(p[1], [0.05, 0.8, 0.15, 0.0])
    assert np.allclose(p[[0, 2, 3]], np.eye(4)[[0, 2, 3]])


def test_top_classes_by_prior_updates_then_class_id() -> None:
    assert prior.top_classes(state(), n2=10, top=3) == [1, 2, 0]
    assert prior.top_classes(state(), n2=None, top=4) == [1, 2, 0, 3]  # n2 unknown: counted from min(C2)


def test_heatmap_other_column_keeps_the_mass_outside_the_shown_classes() -> None:
    learned, clip = prior.heatmap_frames(state(), [1, 0])
    row = learned[learned["embedding_class"] == "class 1"].set_index("class")["prior"]
    assert row.to_dict() == pytest.approx({"class 1": 0.8, "class 0": 0.05, prior.OTHER: 0.15})
    assert clip.groupby("embedding_class")["prior"].sum().tolist() == [1.0, 1.0]
    assert prior.check_state({"V": np.ones((2, 3))}) is not None  # no class_ids: explained, not a crash


@pytest.fixture
def captured_exec(monkeypatch: pytest.MonkeyPatch) -> dict:
    seen: dict = {}

    def fake_execve(path: str, argv: list[str], env: dict) -> None:
        seen.update(path=path, argv=argv, env=env)

    monkeypatch.setattr(launch.os, "execve", fake_execve)
    return seen


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_bca_dashboard_binds_loopback_by_default(captured_exec: dict, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboard", "--results", str(tmp_path), "--port", "8765"])
    assert result.exit_code == 0, result.output
    argv = captured_exec["argv"]
    assert argv[1:4] == ["-m", "streamlit", "run"] and Path(argv[4]).name == "app.py" and Path(argv[4]).is_file()
    assert option(argv, "--server.address") == "127.0.0.1"
    assert option(argv, "--server.port") == "8765"
    assert option(argv, "--browser.gatherUsageStats") == "false"
    assert captured_exec["env"][RESULTS_ENV] == str(tmp_path.resolve())


def test_bca_dashboard_host_option(captured_exec: dict, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["dashboard", "--results", str(tmp_path), "--host", "0.0.0.0"])
    assert result.exit_code == 0, result.output
    assert option(captured_exec["argv"], "--server.address") == "0.0.0.0"
    assert option(captured_exec["argv"], "--server.port") == "8501"


# ------------------------------------------------------------------------------- metrics, tables, exports
def test_metric_columns_are_whatever_numeric_metric_the_views_carry() -> None:
    runs = runs_frame().assign(ece=[5.0, 4.0, 3.0, 2.0, 1.0], new_score=[1, 2, 3, 4, 5], n_rows=100)
    columns = metrics.metric_columns(runs, ["tau", "n1", "n2"])
    # registered ones in their order, then an unregistered numeric column under its own name; never hparams,
    # seeds or row counts
    assert columns == ["accuracy", "ece", "new_score"]
    assert metrics.label("ece") == "expected calibration error (%)" and metrics.label("new_score") == "new_score"
    assert metrics.best_index(runs["ece"], "ece").tolist() == [False, False, False, False, True]  # lower is better
    assert metrics.best_index(runs["accuracy"], "accuracy").tolist() == [False, False, True, False, False]


def test_metric_table_mean_std_best_and_pinned_delta() -> None:
    runs = runs_frame().assign(status="finished", complete=True, setting_id="s1", group_id=list("abbde"))
    labels = queries.group_labels(runs, ["method"], ["tau", "n1", "n2"])
    assert labels.tolist() == ["CLIP", "BCA", "BCA", "BCA", "BCA"]
    summary = queries.metric_summary(runs, labels, "accuracy")
    text, numbers, best = queries.metric_table(summary, "accuracy", pinned="CLIP")
    rows = text.set_index("configuration")
    bca = runs.loc[runs["method"] == "bca", "accuracy"]
    # BCA pools three configurations: (tau 0.3, seeds 1 and 2) and two on seed 1; CLIP ran seeds 1 only, so the
    # seeds recorded there (1 and 2) leave CLIP at 1 of 2
    assert rows.at["BCA", "ImageNet"] == f"{bca.mean():.2f} ± {bca.std():.2f} [{bca.min():.2f}] (n=4 of 6)"
    assert numbers.set_index("configuration").at["BCA", "ImageNet worst10"] == bca.min()  # 4 runs: the worst 1
    assert rows.at["CLIP", "ImageNet"] == "50.00 (n=1 of 2)"  # one run: no spread
    # paired on (setting, seed, order): CLIP has seed 1 only, so BCA's seed-1 runs against it
    seed1 = runs[(runs["method"] == "bca") & (runs["seed"] == 1)]["accuracy"].mean()
    assert rows.at["BCA", "Δ CLIP (ImageNet)"] == f"{seed1 - 50:+.2f} (n=1)"
    # both cells incomplete: neither is "best"
    assert best.set_index(text["configuration"])["ImageNet"].to_dict() == {"CLIP": False, "BCA": False}
    assert numbers.set_index("configuration").at["BCA", "ImageNet std"] == pytest.approx(bca.std())


def test_metric_table_best_compares_one_stream_protocol_and_marks_skipped_samples() -> None:
    """24.7 on the workbench: OnZeta on a contaminated stream and BCA on an i.i.d. one are each best in their own
    protocol; 24.1: a run that skipped images says so in its cell."""
    runs = pd.DataFrame({
        "run_id": list("abcd"), "sweep": "s", "backbone": "RN50", "dataset": "imagenet", "seed": 1,
        "method": ["clip", "bca", "clip", "onzeta"], "status": "finished", "complete": True,
        "stream": ["iid", "iid", '{"contaminated":{"rate":0.2}}', '{"contaminated":{"rate":0.2}}'],
        "setting_id": ["i", "i", "c", "c"], "group_id": list("abcd"), "n_samples": [30, 30, 50, 50],
        "n_skipped": [10, 10, 0, 0], "accuracy": [50.0, 60.0, 70.0, 90.0]})
    labels = queries.series_labels(runs, [])
    summary = queries.metric_summary(runs, labels, "accuracy")
    text, _, best = queries.metric_table(summary, "accuracy")
    bold = set(text["configuration"][best["ImageNet"]])
    assert bold == {"BCA (stream=iid)", "OnZeta (stream=contaminated(rate=0.2))"}
    assert text.set_index("configuration").at["BCA (stream=iid)", "ImageNet"] == "60.00 (n=1; 30 of 40 samples)"


def test_markdown_and_latex_exports_bold_the_best() -> None:
    text = pd.DataFrame({"method": ["CLIP", "BCA_x"], "ImageNet": ["60.00 ± 0.10", "62.00 ± 0.20"]})
    best = pd.DataFrame({"method": [False, False], "ImageNet": [False, True]})
    md = export.to_markdown(text, best).splitlines()
    assert md[1] == "| :--- | ---: |" and md[3] == "| BCA_x | **62.00 ± 0.20** |"
    tex = export.to_latex(text, best, caption="Top-1 (%)")
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex and r"\begin{tabular}{lr}" in tex
    assert r"BCA\_x & \textbf{62.00 $\pm$ 0.20} \\" in tex and r"CLIP & 60.00 $\pm$ 0.10 \\" in tex


def test_chart_export_png_and_svg() -> None:
    chart = charts.metric_bars(pd.DataFrame({"series": ["CLIP", "BCA"], "mean": [60.0, 62.0], "std": [0.1, 0.2],
                                             "n": [2, 2]}), {"CLIP": "clip", "BCA": "bca"}, "accuracy (%)")
    assert export.chart_image(chart, "png")[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in export.chart_image(chart, "svg")[:200]
    with pytest.raises(ValueError, match="'png' or 'svg', got 'gif'"):
        export.chart_image(chart, "gif")


def test_colours_one_hue_per_method_shades_per_setting() -> None:
    """CLIP+LA, CLIP+PA and BCA (one family) are three hues; the settings of one method are shades of its hue."""
    series = {"CLIP": "clip", "BCA (tau=0.2)": "bca", "BCA (tau=0.5)": "bca", "CLIP+LA": "la", "CLIP+PA": "pa",
              "TDA": "tda"}
    scale = charts.family_colours(series).to_dict()
    colours = dict(zip(scale["domain"], scale["range"]))
    assert scale["domain"][0] == "CLIP" and len(set(colours.values())) == len(series)  # all distinct

    def hue(hex_colour: str) -> float:
        import colorsys
        return colorsys.rgb_to_hsv(*(int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)))[0]

    def apart(a: float, b: float) -> float:
        return min(abs(a - b), 1 - abs(a - b))

    family = [hue(colours[s]) for s in ("CLIP+LA", "CLIP+PA", "BCA (tau=0.2)")]
    assert min(apart(a, b) for i, a in enumerate(family) for b in family[i + 1:]) > 0.05
    assert apart(hue(colours["BCA (tau=0.2)"]), hue(colours["BCA (tau=0.5)"])) < 0.02


def test_disagreements_by_class_and_over_the_stream() -> None:
    pair = pd.DataFrame({"sample_idx": range(6), "label": [0, 0, 1, 1, 2, 2],
                         "correct_a": [True, False, True, True, False, False],
                         "correct_b": [True, True, False, True, True, True]})
    diff = queries.disagreements(pair)
    assert diff["winner"].tolist() == ["B", "A", "B", "B"]
    by_class = queries.disagreements_by_class(diff)
    assert by_class.set_index("label")[["A", "B", "net"]].to_dict("index") == {
        2: {"A": 0, "B": 2, "net": 2}, 0: {"A": 0, "B": 1, "net": 1}, 1: {"A": 1, "B": 0, "net": -1}}
    over = queries.disagreements_over_stream(diff, window=4, length=6)
    assert over.to_dict("records") == [{"position": 4, "winner": "A", "n": 1}, {"position": 4, "winner": "B", "n": 1},
                                       {"position": 6, "winner": "A", "n": 0}, {"position": 6, "winner": "B", "n": 2}]


def test_importance_finds_the_setting_that_moves_the_metric() -> None:
    rng = np.random.default_rng(0)
    tau = np.repeat([0.1, 0.3, 0.5, 0.7], 4)
    n2 = np.tile([1, 10, 100, 1000], 4)
    runs = pd.DataFrame({"tau": tau, "n2": n2, "dataset": "d", "backbone": "b",
                         "accuracy": 50 + 20 * tau + 0.01 * rng.normal(size=16)})
    scores = importance.hparam_importance(runs, ["tau", "n2", "n1"], "accuracy")
    assert scores["setting"].tolist() == ["tau", "n2"]  # n1 does not vary: not a feature
    assert scores.at[0, "importance"] > 10 * max(scores.at[1, "importance"], 1e-6)
    assert importance.hparam_importance(runs.head(importance.MIN_RUNS - 1), ["tau"], "accuracy").empty


def test_reproduce_spec_narrows_the_record_to_one_run() -> None:
    record = {"run_ids": ["r1"], "spec": {
        "name": "s", "results_dir": "/x", "cache_dir": None, "seeds": [1, 2], "templates": ["dataset"],
        "backbones": [{"model": "RN50", "pretrained": "openai", "checkpoint": None},
                      {"model": "ViT-B-16", "pretrained": "openai", "checkpoint": None}],
        "datasets": [{"name": "imagenet", "views": None}, {"name": "dtd", "views": None}],
        "methods": [{"method": "bca", "tau": [0.2, 0.3], "datasets": None}]}}
    config = {"sweep": "s", "backbone": "ViT-B-16", "pretrained": "openai", "dataset": "dtd", "method": "bca",
              "seed": 2, "templates": "dataset", "hparams": {"tau": 0.3, "n1": 30000}}
    spec = context.reproduce_spec(record, config, "r1")
    assert spec["backbones"] == [{"model": "ViT-B-16", "pretrained": "openai"}]
    assert spec["datasets"] == [{"name": "dtd"}] and spec["seeds"] == [2] and spec["name"] == "s"
    assert spec["methods"] == [{"method": "bca", "tau": 0.3, "n1": 30000}] and "cache_dir" not in spec
    assert spec["results_dir"] == "reproduce-r1"
    assert context.reproduce_spec(record, config, "other") is None  # not a run of this sweep


def test_class_names_from_the_cache_manifest(tmp_path: Path) -> None:
    entry = tmp_path / "features" / "k"
    entry.mkdir(parents=True)
    (entry / "manifest.json").write_text('{"dataset": "dtd", "backbone": "RN50 (openai)", "class_names": ["a", "b"]}')
    names = context.class_names(tmp_path, "dtd", "RN50")
    assert names == ["a", "b"] and context.class_names(tmp_path, "dtd", "ViT-B-16") == []
    namer = context.class_namer(names)
    assert (namer(1), namer(5)) == ("1: b", "class 5")
    assert context.class_namer([])(3) == "class 3"


def plot_height(chart) -> float:
    """Height in px of a chart's plotting area (Vega's root frame) as vl-convert renders it when, as Streamlit
    does, title, axes and legend must fit into the chart's height."""
    fitted = chart.properties(autosize=alt.AutoSizeParams(type="fit", contains="padding"), width=800)
    svg = export.chart_image(fitted, "svg").decode()
    match = re.search(r'role-frame root".*?<path class="background"[^>]* d="M[\d.]+,[\d.]+h([\d.]+)v([\d.]+)', svg)
    assert match, svg[:300]
    return float(match.group(2))


@pytest.mark.parametrize("n_series", [2, 20])
def test_charts_keep_a_plotting_area_with_many_configurations(n_series: int) -> None:
    """The issue's flat line: a fixed height filled by the legend. Heights follow the number of series."""
    methods = ["clip", "la", "pa", "bca", "tda"]
    series = {f"{registry.method_label(methods[i % 5])} (setting={i}, a long label to cut)": methods[i % 5]
              for i in range(n_series)}
    names = list(series)
    curve = pd.DataFrame([{"series": s, "position": p, "cumulative": 60.0 + i, "cumulative_std": 1.0, "runs": 2}
                          for i, s in enumerate(names) for p in (100, 200, 300)])
    points = pd.DataFrame([{"series": s, "value": v, "mean": 60.0 + i, "std": 0.5, "n": 2}
                           for i, s in enumerate(names) for v in (1, 10, 1000)])
    summary = pd.DataFrame({"series": names, "mean": np.arange(n_series) + 60.0, "std": 0.5, "n": 2})
    per_class = pd.DataFrame([{"series": s, "class": f"class {k}", "accuracy": 50.0, "n": 3}
                              for s in names for k in range(10)])
    for chart in (charts.online_accuracy(curve, series), charts.sensitivity(points, "n2", series, baselines={"CLIP": 61.0}),
                  charts.metric_bars(summary, series, "accuracy (%)"), charts.per_class_accuracy(per_class, series)):
        assert plot_height(chart) >= max(50, 15 * n_series)  # room for every series, whatever the legend takes


def test_stream_bands_stay_within_0_and_100() -> None:
    """An accuracy near 100 (or 0) with a wide spread: the ± one-std band is cut at the scale's ends."""
    curve = pd.DataFrame({"series": ["BCA", "BCA", "CLIP"], "position": [10, 20, 10], "cumulative": [97.0, 3.0, 50.0],
                          "cumulative_std": [8.0, 6.0, 1.0], "runs": 3})
    data = charts.online_accuracy(curve, {"BCA": "bca", "CLIP": "clip"}).to_dict()["datasets"]
    rows = next(iter(data.values()))
    assert [(r["lo"], r["hi"]) for r in rows] == [(89.0, 100.0), (0.0, 9.0), (49.0, 51.0)]


def test_dot_chart_names_its_dataset() -> None:
    summary = pd.DataFrame({"series": ["CLIP", "BCA"], "mean": [60.0, 62.0], "std": [0.1, 0.2], "n": [2, 2]})
    spec = charts.metric_bars(summary, {"CLIP": "clip", "BCA": "bca"}, "accuracy (%)", "ImageNet-A").to_dict()
    assert spec["title"] == "accuracy (%) on ImageNet-A"


def test_run_selector_names_stream_and_order() -> None:
    """Runs of one configuration that differ only in stream and order read differently in the run selector (and
    so in the run page's title)."""
    from dashboard.pages import run_options

    table = pd.DataFrame({"run_id": ["r0aaaaaaaa", "r1bbbbbbbb", "r2cccccccc"], "sweep": "demo",
                          "backbone": "synthetic", "dataset": "synthetic-fine_grained", "method": "bca", "seed": 1,
                          "stream": ["iid", "iid", '{"dirichlet":{"gamma":0.01}}'], "order_index": [0, 1, 0],
                          "tau": 0.3})
    options = run_options(table, ["tau"])
    assert len(set(options.values())) == 3
    assert options["r1bbbbbbbb"].split(" · ")[2:5] == ["iid", "seed 1", "order 1"]
    assert "dirichlet(gamma=0.01)" in options["r2cccccccc"]
