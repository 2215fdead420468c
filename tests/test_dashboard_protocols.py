"""The dashboard on a demo-like sweep's results (several stream protocols, orders, a contaminated stream's OOD
rows): every page opens, the sensitivity curves and the best cells are per stream protocol, OOD samples are
counted apart (no sample of them is right or wrong, docs/streams-and-metrics.md), and rows are told apart by
method id, never by display label. Through streamlit's AppTest, on written results (no sweep: seconds)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from dashboard_results import PROTOCOL_OOD_EVERY, protocol_results
from test_dashboard_apptest import assert_clean, comparison, paper_table, run_app

from dashboard import export, queries, significance
from orchestrator.registry import MethodCard
from orchestrator.registry import methods as registry_methods
from orchestrator.results import report
from orchestrator.results.db import ResultsDB
from orchestrator.results.testing import make_fake_results


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return protocol_results(tmp_path_factory.mktemp("protocols"))


@pytest.fixture(scope="module")
def runs(results: Path):
    with ResultsDB(results) as db:
        return db.df("SELECT a.*, p.helped, p.hurt, p.both_right, p.both_wrong FROM accuracy a "
                     "LEFT JOIN paired p USING (run_id) ORDER BY run_id")


def chart_data(at, title: str | None = None, mark: str | None = None) -> tuple[dict, pd.DataFrame]:
    """(spec, data) of the first chart titled `title` (or drawn with `mark`): its data as the page sends it (Arrow,
    beside the spec)."""
    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        if (title is None or spec.get("title") == title) and (mark is None or spec.get("mark", {}).get("type") == mark):
            frames = [pa.ipc.open_stream(d.data.data).read_pandas() for d in element.proto.datasets]
            return spec, pd.concat(frames, ignore_index=True)
    raise AssertionError(f"no chart titled {title!r} (mark {mark!r}) among "
                         f"{[json.loads(e.proto.spec).get('title') for e in at.get('vega_lite_chart')]}")


def test_configuration_page_of_a_run_with_orders(results: Path, runs, monkeypatch: pytest.MonkeyPatch) -> None:
    group = runs[(runs["method"] == "bca") & (runs["n1"] == 100)]["group_id"].iloc[0]
    at = run_app(results, monkeypatch, page="Configuration", config=group)
    assert_clean(at)
    per_run = at.dataframe[0].value
    assert sorted(per_run["order_index"]) == [0, 1, 2]
    summary = at.dataframe[1].value
    assert "order_index" not in set(summary["metric"])  # which order a run is, not a measure of it


def test_order_index_is_not_a_metric(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(results, monkeypatch)
    assert_clean(at)
    assert not {"order_index", "batch_size", "seed"} & set(at.selectbox(key="select_metric").options)


def test_sensitivity_per_stream_protocol(results: Path, runs, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(results, monkeypatch, panel="Sensitivity")
    assert_clean(at)
    _, data = chart_data(at, "sensitivity to n1")
    points = data[data["series"].notna()].to_dict("records")
    # one curve per protocol, each point over that protocol's three orders
    bca = runs[(runs["method"] == "bca") & (runs["dataset"] == "imagenet")]
    expected = {}
    for stream, own in bca.groupby("stream"):
        for n1, point in own.groupby("n1"):
            expected[(stream, float(n1))] = (point["accuracy"].mean(), len(point))
    assert len(points) == len(expected) == 4, points
    shown = {}
    for p in points:
        stream = next(s for s in bca["stream"].unique() if evidence_protocol(s) in p["series"])
        shown[(stream, p["value"])] = (p["mean"], p["n"])
    assert shown.keys() == expected.keys()
    for key, (mean, n) in expected.items():
        assert shown[key][0] == pytest.approx(mean) and shown[key][1] == n == 3
    # CLIP's reference line per protocol, each over that protocol's runs
    clip = runs[(runs["method"] == "clip") & (runs["dataset"] == "imagenet")]
    references = dict(zip(data["label"].dropna(), data["baseline"].dropna()))
    assert references == pytest.approx({f"CLIP · {evidence_protocol(s)}": own["accuracy"].mean()
                                        for s, own in clip.groupby("stream")})
    assert "one curve per stream protocol" in " ".join(c.value for c in at.caption)


def evidence_protocol(stream: str) -> str:
    from orchestrator.results.evidence import protocol

    return protocol(stream)


def test_two_runs_count_ood_samples_apart(results: Path, runs, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a contaminated stream: the four counts are over the in-distribution samples, as the paired view's
    (`bca query`), and the OOD samples are a count of their own."""
    same = runs[(runs["dataset"] == "imagenet") & runs["stream"].str.contains("contaminated")
                & (runs["order_index"] == 0)]
    clip = same[same["method"] == "clip"].iloc[0]
    bca = same[(same["method"] == "bca") & (same["n1"] == 100)].iloc[0]
    at = run_app(results, monkeypatch, page="Compare two runs", run_a=clip["run_id"], run_b=bca["run_id"])
    assert_clean(at)
    counts = {m.label: int(m.value) for m in at.metric}
    assert counts == {"both right": bca["both_right"], "only A right": bca["hurt"], "only B right": bca["helped"],
                      "both wrong": bca["both_wrong"], "OOD, not scored": 200 // PROTOCOL_OOD_EVERY}
    mcnemar = at.table[0].value
    assert int(mcnemar.to_numpy().sum()) == 200 - 200 // PROTOCOL_OOD_EVERY


def test_per_class_leaves_ood_out(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    at = run_app(results, monkeypatch, panel="Per class")
    assert_clean(at)
    per_class = at.dataframe[-1].value
    assert sorted(per_class["label"]) == list(range(10))  # the ten classes, no "class -1" of the OOD samples
    _, heat = chart_data(at, mark="rect")
    assert set(heat["class"]) == {f"class {k}" for k in range(10)}


def bold_cells(element) -> set[tuple[str, str]]:
    """(row's first cell, column) of every cell a styled st.table shows in bold."""
    table = element.value
    styles = element.proto.arrow_data.styler.styles
    cells = set()
    for rule in styles.split("}"):
        if "font-weight: bold" in rule:
            for row, col in re.findall(r"row(\d+)_col(\d+)", rule):
                cells.add((table.iat[int(row), 0], table.columns[int(col)]))
    return cells


def test_average_best_per_stream_protocol(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caption says best among cells of one stream protocol: the Average column too, on the page and in
    its Markdown export."""
    at = run_app(results, monkeypatch)
    assert_clean(at)
    assert "best (higher) in bold among complete cells of one stream protocol" in " ".join(c.value for c in at.caption)
    # each protocol's best: BCA n1=24000 on the i.i.d. stream, n1=100 on the contaminated one (PROTOCOL_ACCURACY)
    iid, contaminated = "BCA (stream=iid, n1=24000)", "BCA (stream=contaminated(rate=0.2), n1=100)"
    assert bold_cells(at.table[0]) == {(row, column) for row in (iid, contaminated)
                                       for column in ("ImageNet", "ImageNet-A", "Average")}
    with ResultsDB(results) as db:
        all_runs = queries.accuracy_runs(db)
    text, _, best = queries.metric_table(
        queries.metric_summary(all_runs, queries.series_labels(all_runs, ["tau", "n1"]), "accuracy"), "accuracy")
    bold = {line.split(" | ")[0].strip("| ") for line in export.to_markdown(text, best).splitlines()
            if line.endswith(" (n=3)** |")}  # the Average cell, the last, in bold
    assert bold == {iid, contaminated}


def test_rows_are_told_apart_by_method_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A method labelled like a configuration of CLIP ("CLIP (T)") stays when the method filter hides CLIP's
    rows: rows are told apart by method id, not by label."""
    monkeypatch.setitem(registry_methods._CARDS, "clip_t", MethodCard(
        "clip_t", "CLIP (T)", 96, "toy", "CLIP at another temperature", "orchestrator.methods.clip.method:Clip"))
    results = tmp_path / "results"
    make_fake_results(results, methods={"clip": {}, "clip_t": {}, "bca": {"tau": 0.3}}, seeds=(1,), n=60,
                      save_state=False)
    at = run_app(results, monkeypatch, filter_method="clip_t", panel="Paper tables")
    assert_clean(at)
    assert comparison(at)["configuration"].tolist() == ["CLIP (T)"]
    paper = paper_table(at)  # the report's table: CLIP's rows queried as the gain's baseline, then hidden
    assert paper["method"].tolist() == ["CLIP (T)"]


def rendered_texts(at, title: str | None = None, mark: str | None = None) -> list[str]:
    """Every text of a page's chart as Vega draws it (vl-convert's renderer, the page's spec and data)."""
    import vl_convert

    for element in at.get("vega_lite_chart"):
        spec = json.loads(element.proto.spec)
        if (title is None or spec.get("title") == title) and (mark is None or mark in element.proto.spec):
            spec["datasets"] = {d.name: json.loads(pa.ipc.open_stream(d.data.data).read_pandas().to_json(
                orient="records")) for d in element.proto.datasets}
            svg = vl_convert.vegalite_to_svg(json.dumps(spec))
            return [html.unescape(t) for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg)]
    raise AssertionError(f"no chart titled {title!r}")


def test_legends_show_every_label_in_full(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Grouped by several columns: the legend names each series in full (the stream by its protocol), so settings
    that differ only at the end of their long labels never read the same."""
    at = run_app(results, monkeypatch, group=["dataset", "backbone", "method", "stream", "seed", "n1"],
                 filter_dataset="imagenet")
    assert_clean(at)
    labels = set(comparison(at)["configuration"])
    assert "ImageNet · RN50 · BCA · stream=contaminated(rate=0.2) · seed=1 · n1=24000" in labels, labels
    texts = rendered_texts(at, mark="line")  # the Stream panel's curves, their legend on the right
    assert labels <= set(texts), sorted(set(texts) - labels)


def test_run_page_names_ood_samples(results: Path, runs, monkeypatch: pytest.MonkeyPatch) -> None:
    run = runs[(runs["method"] == "bca") & runs["stream"].str.contains("contaminated")].iloc[0]
    at = run_app(results, monkeypatch, page="Run", run=run["run_id"])
    assert_clean(at)
    stream = at.dataframe[0].value
    ood = stream["sample_idx"] % PROTOCOL_OOD_EVERY == PROTOCOL_OOD_EVERY - 1
    assert (stream.loc[ood, "label"] == "OOD").all() and stream.loc[~ood, "label"].str.startswith("class ").all()


def test_first_screen_is_the_comparison_with_its_evidence(results: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workbench opens on two tables, row for row: the comparison, then each configuration's gain over CLIP
    with its interval and verdict; the charts, the tests' details and the paper's tables wait in their panels."""
    at = run_app(results, monkeypatch)
    assert_clean(at)
    assert len(at.table) == 2  # nothing else drawn as a table on the first view
    rows = comparison(at)["configuration"].tolist()
    evidence = at.table[1].value
    assert evidence["configuration"].tolist() == [r for r in rows if not r.startswith("CLIP (")]
    with ResultsDB(results) as db:
        gains = significance.gain_summary(report.report_tables(db))  # the report's cells, stars and families
    assert len(gains) == evidence.shape[0] * (evidence.shape[1] - 2)  # every cell tested, none left out
    cells = evidence.set_index("configuration")
    for g in gains.itertuples():
        cell = cells.at[g.series, g.column]
        assert cell == f"{g.gain:+.2f} [{g.low:+.2f}, {g.high:+.2f}]" + (" ✓" if g.significant else ""), cell
    assert [m.value for m in at.markdown if m.value.startswith("**Gain over CLIP")]  # its heading says what it is
    evidence_panel = run_app(results, monkeypatch, panel="Evidence")
    assert any({"series", "dataset"} <= set(t.value.columns) for t in evidence_panel.table)  # the tests' table


def test_two_runs_offer_the_same_stream_first(results: Path, runs, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run B's first choice is a run that saw A's very stream: same data setting (stream protocol), seed and order,
    not merely the first run listed on A's dataset."""
    with ResultsDB(results) as db:
        listed = queries.run_table(db)["run_id"].tolist()  # the selectors' order
    by_id = runs.set_index("run_id")
    key = ["setting_id", "seed", "order_index"]

    def first_on_its_dataset(run: str) -> str:
        return next(r for r in listed if r != run and by_id.at[r, "dataset"] == by_id.at[run, "dataset"])

    a = next(r for r in listed if (by_id.loc[first_on_its_dataset(r), key] != by_id.loc[r, key]).any())
    at = run_app(results, monkeypatch, page="Compare two runs", run_a=a)
    assert_clean(at)
    b = at.selectbox(key="select_run_b").value
    assert by_id.loc[b, key].tolist() == by_id.loc[a, key].tolist()
