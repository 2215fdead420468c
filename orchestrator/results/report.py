"""Tables from stored results: the paper's Table 1 (OOD) and Table 2 (cross-domain), and a generic
method x dataset table for any sweep (synthetic scenarios included).

Cells are mean ± std over seeds of finished runs with all their rows (the accuracy view's `complete`). An average column is computed per seed
over the seeds that cover all of its datasets, then mean ± std over those seeds; if no seed covers them all
it is missing. Missing cells are NaN in frames and "—" when rendered, never zero. Rows are (backbone, method);
when one method was run with several settings on a dataset (an hparam grid, several sweeps), the settings
that vary label separate rows, e.g. "BCA (tau=0.3)". Gain over CLIP compares a row with the CLIP row of the
same backbone (and same setting label, if CLIP has several).

Runs with random weights (run config `pretrained: random`) are labelled so wherever they appear: their backbone
reads "RN50 (random weights)" in the tables, so they are never set beside the published numbers of RN50, and
the dashboard's series say "[random weights]".
"""

from __future__ import annotations

import json
import math
import re
import shutil
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator import registry
from orchestrator.data.streams import stream_label
from orchestrator.results import metrics, stats
from orchestrator.results.db import ResultsDB

MISSING = "—"
SIGNIFICANT = "*"  # on a cell whose gain over the row's baseline is significant (`_significance`)
PAPER_FILE = "paper_results.json"


def wide_console(file: Any = None) -> Console:
    """A console wide enough for the paper's tables: piped output defaults to 80 columns, which folds them
    (tables take only the width they need)."""
    return Console(file=file, width=max(240, shutil.get_terminal_size().columns))


@dataclass(frozen=True)
class Layout:
    key: str
    title: str
    datasets: tuple[tuple[str, str], ...]  # (canonical dataset key, column label)
    averages: tuple[tuple[str, tuple[str, ...]], ...]  # (column label, dataset keys it averages)

    @property
    def columns(self) -> list[str]:
        return [label for _, label in self.datasets] + [label for label, _ in self.averages]


_OOD = tuple((name, registry.DATASETS[name].title) for name in registry.group_datasets(registry.OOD))
_CD = tuple((name, registry.DATASETS[name].title) for name in registry.group_datasets(registry.CROSS_DOMAIN))
TABLE1 = Layout("ood", "Table 1: OOD benchmark", _OOD,
                (("Average", tuple(k for k, _ in _OOD)), ("OOD Average", tuple(k for k, _ in _OOD[1:]))))
TABLE2 = Layout("cross_domain", "Table 2: cross-domain benchmark", _CD,
                (("Average", tuple(k for k, _ in _CD)),))
PAPER_LAYOUTS = (TABLE1, TABLE2)

RANDOM_WEIGHTS = "random"  # the run config's `pretrained` of a backbone run with random weights on purpose
RANDOM_WEIGHTS_NOTE = "random weights"

# The per-run metrics a table can show (the registry: orchestrator.results.metrics).
METRICS = {m.name: m for m in metrics.RUN_METRICS}

# Run settings that may tell rows of one method apart (besides every hparam column).
_VARIANT_CANDIDATES = ("sweep", "pretrained", "templates", "num_templates", "views", "stream")


def backbone_label(name: str) -> str:
    """open_clip names to the paper's: ViT-B-16 -> ViT-B/16, RN50-quickgelu -> RN50."""
    base = re.sub(r"-quickgelu$", "", name, flags=re.IGNORECASE)
    m = re.match(r"^(ViT-[A-Za-z]+)-(\d+)$", base)
    return f"{m.group(1)}/{m.group(2)}" if m else base


def load_paper_results() -> dict[str, Any]:
    """The published numbers (with their source), as carried in paper_results.json."""
    text = resources.files("orchestrator.results").joinpath(PAPER_FILE).read_text(encoding="utf-8")
    return json.loads(text)


# ------------------------------------------------------------------------------------------------- data
def finished_runs(db: ResultsDB, sweep: str | None = None) -> pd.DataFrame:
    """One row per finished, complete run with its accuracy (accuracy view), optionally for one sweep."""
    where = "status = 'finished' AND complete" + (" AND sweep = $sweep" if sweep is not None else "")
    params = {"sweep": sweep} if sweep is not None else None
    return db.df(f"SELECT * FROM accuracy WHERE {where} ORDER BY backbone, method, dataset, seed", params)


def _fmt_value(value: Any, column: str = "") -> str:
    if column == "stream" and isinstance(value, str) and value.startswith("{"):
        return stream_label(json.loads(value))  # the runs table holds the spec's value as JSON
    return f"{value:g}" if isinstance(value, float) else str(value)


def row_labels(runs: pd.DataFrame, hparams: Sequence[str], extra: Sequence[str] = ()) -> pd.Series:
    """A label per run naming its configuration apart from the seed: the method's label, plus the settings
    that vary between its runs of one backbone and dataset, e.g. "BCA (tau=0.3)" (the tables' rows, the
    dashboard's series); a run with random weights says so."""
    labels = _row_labels(runs, hparams, extra)[0]
    if "pretrained" in runs.columns:
        random = runs["pretrained"] == RANDOM_WEIGHTS
        labels = labels.where(~random, labels + f" [{RANDOM_WEIGHTS_NOTE}]")
    return labels


def _row_labels(runs: pd.DataFrame, hparams: Sequence[str], extra: Sequence[str]) -> tuple[pd.Series, list[str]]:
    labels = runs["method"].map(registry.method_label)
    candidates = [c for c in (*extra, *_VARIANT_CANDIDATES, *hparams, "group_id") if c in runs.columns]
    if runs.empty:
        return labels, []
    # distinct values of each setting per (backbone, method, dataset), then the most any dataset has
    distinct = runs.groupby(["backbone", "method", "dataset"])[candidates].nunique(dropna=False)
    most = distinct.groupby(level=["backbone", "method"]).max()
    split: set[str] = set()
    for (backbone, method), counts in most.iterrows():
        vary = [c for c in candidates if c != "group_id" and counts[c] > 1]
        if not vary and "group_id" in counts and counts["group_id"] > 1:
            vary = ["group_id"]  # configs differ only in keys without a column (e.g. synthetic parameters)
        if vary:
            split.update(vary)
            part = runs[(runs["backbone"] == backbone) & (runs["method"] == method)]
            text = [", ".join(f"{c}={_fmt_value(_plain(v), c)}" for c, v in zip(vary, values))
                    for values in part[vary].itertuples(index=False)]
            labels.loc[part.index] = [f"{registry.method_label(method)} ({t})" for t in text]
    return labels, sorted(split)


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones, so 0.3 prints as 0.3."""
    return value.item() if hasattr(value, "item") else value


def _with_row_labels(runs: pd.DataFrame, hparams: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
    """Display backbones, and a 'row' label per run (`row_labels`); returns the frame and the names of the
    settings that split rows."""
    runs = runs.copy()
    runs["backbone_name"] = runs["backbone"]
    runs["backbone"] = runs["backbone"].map(backbone_label)
    if "pretrained" in runs.columns:
        random = runs["pretrained"] == RANDOM_WEIGHTS
        runs.loc[random, "backbone"] = runs.loc[random, "backbone"] + f" ({RANDOM_WEIGHTS_NOTE})"
    runs["row"], split = _row_labels(runs, hparams, ("backbone_name",))
    return runs, split


@dataclass
class ReportTable:
    """One rendered table. Frames are indexed by (backbone, method[, source]) with one column per table column.

    mean / std / n: over seeds; best: the highest measured mean of each column within each backbone;
    gain: mean minus the CLIP row's mean (same backbone); source rows 'paper' and 'Δ paper' only with paper=True.
    """

    title: str
    columns: list[str]
    gain_columns: list[str]
    mean: pd.DataFrame
    std: pd.DataFrame
    n: pd.DataFrame
    gain: pd.DataFrame
    best: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    # the gain over the row's baseline with evidence (accuracy tables; `_significance`): its 95% interval and
    # Holm-adjusted p-value per cell, NaN where not tested
    gain_low: pd.DataFrame | None = None
    gain_high: pd.DataFrame | None = None
    p_holm: pd.DataFrame | None = None

    def significant(self, key: Any, col: str) -> bool:
        return self.p_holm is not None and bool(self.p_holm.at[key, col] <= stats.ALPHA)

    @property
    def empty(self) -> bool:
        return self.mean.empty

    def to_frame(self) -> pd.DataFrame:
        """Numbers as a flat frame: '<column>' (mean), '<column> std', '<column> n', then 'Δ CLIP (<column>)'."""
        out = pd.DataFrame(index=self.mean.index)
        for col in self.columns:
            out[col] = self.mean[col]
            out[f"{col} std"] = self.std[col]
            out[f"{col} n"] = self.n[col]
        for col in self.gain_columns:
            out[f"Δ CLIP ({col})"] = self.gain[col]
        if self.p_holm is not None:
            for col in self.columns:
                out[f"Δ CLIP ({col}) low"] = self.gain_low[col]
                out[f"Δ CLIP ({col}) high"] = self.gain_high[col]
                out[f"Δ CLIP ({col}) p Holm"] = self.p_holm[col]
        return out

    def formatted(self) -> pd.DataFrame:
        """Display strings: 'mean ± std' (just 'mean' for one seed), signed differences, '—' for missing."""
        out = pd.DataFrame(index=self.mean.index)
        sources = (list(self.mean.index.get_level_values("source")) if "source" in self.mean.index.names
                   else ["measured"] * len(self.mean))
        for col in self.columns:
            cells = []
            for key, source in zip(self.mean.index, sources):
                cells.append(_cell(self.mean.at[key, col], self.std.at[key, col], self.n.at[key, col], source)
                             + (SIGNIFICANT if self.significant(key, col) else ""))
            out[col] = cells
        for col in self.gain_columns:
            out[f"Δ CLIP ({col})"] = [_signed(v) + _interval(self, key, col) for key, v in self.gain[col].items()]
        return out

    def render(self) -> Table:
        """A rich table; best measured cell per column and backbone in bold."""
        text = self.formatted()
        table = Table(title=self.title, title_justify="left", header_style="bold")
        for name in text.index.names:
            table.add_column(name or "", no_wrap=True)
        for col in text.columns:  # Text: names from the results are never read as rich markup
            table.add_column(Text(col), justify="right", no_wrap=True)
        previous_backbone = None
        for key, row in text.iterrows():
            if previous_backbone is not None and key[0] != previous_backbone:
                table.add_section()
            previous_backbone = key[0]
            cells = [Text(str(k)) for k in key]
            for col in text.columns:
                bold = col in self.columns and bool(self.best.at[key, col])
                cells.append(Text(row[col], style="bold green" if bold else ""))
            table.add_row(*cells)
        if self.notes:
            table.caption = Text("\n".join(self.notes))  # Text: "[low, high]" is not rich markup
            table.caption_justify = "left"
        return table


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


def _cell(mean: Any, std: Any, n: Any, source: str) -> str:
    if _is_missing(mean):
        return MISSING
    if source == "Δ paper":
        return _signed(mean)
    if source == "paper" or _is_missing(std) or _is_missing(n) or n < 2:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {std:.2f}"


def _signed(value: Any) -> str:
    return MISSING if _is_missing(value) else f"{value:+.2f}"


def _interval(table: ReportTable, key: Any, col: str) -> str:
    if table.gain_low is None or _is_missing(table.gain_low.at[key, col]):
        return ""
    return f" [{table.gain_low.at[key, col]:+.2f}, {table.gain_high.at[key, col]:+.2f}]"


def _aggregate(runs: pd.DataFrame, layout: Layout, metric: str
               ) -> dict[tuple[str, str, str], dict[str, tuple[float, float, int]]]:
    """{(backbone, method, row): {column label: (mean, std, n)}} for the layout's dataset and average columns,
    over the stream orders of every seed."""
    out: dict[tuple[str, str, str], dict[str, tuple[float, float, int]]] = {}
    label_of = dict(layout.datasets)
    runs = runs.assign(order=runs["order_index"].fillna(0) if "order_index" in runs else 0)
    for (backbone, method, row), part in runs.groupby(["backbone", "method", "row"], sort=False):
        # one value per dataset, seed and order (several sweeps with the same setting are averaged)
        per_seed = part.groupby(["key", "seed", "order"])[metric].mean().unstack("key")
        cells = {}
        for key, label in label_of.items():
            if key in per_seed.columns:
                values = per_seed[key].dropna()
                cells[label] = (float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else math.nan,
                                int(len(values)))
        for label, keys in layout.averages:
            if all(k in per_seed.columns for k in keys):
                values = per_seed[list(keys)].dropna().mean(axis=1)
                if len(values):
                    cells[label] = (float(values.mean()),
                                    float(values.std(ddof=1)) if len(values) > 1 else math.nan, int(len(values)))
        out[(backbone, method, row)] = cells
    return out


def _clip_row(rows: Sequence[tuple[str, str, str]], backbone: str, variant_row: str, method: str) -> tuple | None:
    baseline = registry.baseline_method()
    clip_rows = [r for r in rows if r[0] == backbone and r[1] == baseline]
    suffix = variant_row[len(registry.method_label(method)):]
    same = [r for r in clip_rows if r[2] == registry.method_label(baseline) + suffix]
    if same:
        return same[0]
    return clip_rows[0] if len(clip_rows) == 1 else None


def build_table(db: ResultsDB, layout: Layout, sweep: str | None = None, paper: bool = False,
                runs: pd.DataFrame | None = None, metric: str = "accuracy") -> ReportTable:
    """The layout's table from the finished, complete runs (of `sweep`, if given; or the accuracy-view rows in
    `runs`); paper=True adds the published rows ('paper') and measured minus published ('Δ paper') under each
    (backbone, method)."""
    runs = finished_runs(db, sweep) if runs is None else runs
    # the rule lives here too, so a caller's own selection of accuracy rows cannot let a partial run in
    runs = runs[(runs["status"] == "finished") & runs["complete"].fillna(False).astype(bool)]
    keys = {k for k, _ in layout.datasets}
    runs = runs.assign(key=[registry.dataset_key(d) if layout.key != "generic" else d for d in runs["dataset"]])
    runs = runs[runs["key"].isin(keys)]
    hparams = db.hparam_names
    runs, split = _with_row_labels(runs, hparams)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of: {', '.join(METRICS)}")
    cells = _aggregate(runs, layout, metric) if len(runs) else {}
    columns = layout.columns
    gain_columns = [label for label, _ in layout.averages] or [label for _, label in layout.datasets]

    paper_rows: dict[tuple[str, str], dict[str, float]] = {}
    published_only: dict[str, str] = {}  # methods not run here (e.g. TPT): their label as the paper prints it
    notes = []
    if paper and metric != "accuracy":
        notes.append(f"the paper prints top-1 accuracy only: no published rows for {metric}")
    elif paper:
        published = load_paper_results()
        table = published["tables"].get(layout.key)
        if table is not None:
            for row in table["rows"]:
                paper_rows[(row["backbone"], row["method"])] = row["values"]
                if row.get("published_only"):
                    published_only[row["method"]] = f"{row['label']} (published only)"
            notes.append(f"paper: {published['source']['paper']}")

    row_keys = list(cells)
    for backbone, method in paper_rows:
        if not any(r[0] == backbone and r[1] == method for r in row_keys):
            row_keys.append((backbone, method, published_only.get(method) or registry.method_label(method)))
    row_keys.sort(key=lambda r: (r[0], registry.method_rank(r[1]), r[2]))

    index, means, stds, ns, gains = [], [], [], [], []
    for backbone, method, row in row_keys:
        measured = cells.get((backbone, method, row), {})
        clip_key = _clip_row(list(cells), backbone, row, method)
        clip_cells = cells.get(clip_key, {}) if clip_key else {}
        gain = {c: measured[c][0] - clip_cells[c][0] if c in measured and c in clip_cells else math.nan
                for c in columns}
        sources = [("measured", {c: measured.get(c, (math.nan, math.nan, 0)) for c in columns})]
        published = paper_rows.get((backbone, method))
        if published is not None:
            paper_source = ("paper", {c: (published.get(c, math.nan), math.nan, 1) for c in columns})
            sources = [paper_source] if method in published_only else [*sources, paper_source, (
                "Δ paper", {c: (measured[c][0] - published[c] if c in measured and c in published else math.nan,
                                math.nan, 1) for c in columns})]
        for source, values in sources:
            index.append((backbone, row, source) if paper else (backbone, row))
            means.append({c: values[c][0] for c in columns})
            stds.append({c: values[c][1] for c in columns})
            ns.append({c: values[c][2] for c in columns})
            gains.append(gain if source == "measured" else {c: math.nan for c in columns})
    names = ["backbone", "method", "source"] if paper else ["backbone", "method"]
    idx = pd.MultiIndex.from_tuples(index, names=names) if index else pd.MultiIndex.from_tuples([], names=names)
    mean = pd.DataFrame(means, index=idx, columns=columns, dtype=float)
    std = pd.DataFrame(stds, index=idx, columns=columns, dtype=float)
    n = pd.DataFrame(ns, index=idx, columns=columns).fillna(0).astype(int)
    gain = pd.DataFrame(gains, index=idx, columns=columns, dtype=float)
    best = _best(mean, paper, METRICS[metric].higher_is_better)
    if split:
        notes.append(f"rows split by settings that vary within a dataset: {', '.join(split)}")
    table = ReportTable(f"{layout.title}, {METRICS[metric].label}", columns, gain_columns, mean, std, n, gain, best,
                        notes)
    if metric == "accuracy":  # the tests are of top-1 accuracy: helped against hurt on the same samples
        _significance(db, table, runs, layout)
    return table


def _significance(db: ResultsDB, table: ReportTable, runs: pd.DataFrame, layout: Layout) -> None:
    """Each measured cell's gain over CLIP with evidence, from the paired view's runs (each against CLIP on the
    same samples, seed and order; both finished and complete): stats.across_runs over the cell's runs, and for
    an average column over its per-(seed, order) means of the datasets' gains. The p-values are Holm-adjusted
    over the table's tested cells, and the legend says so."""
    cols = table.columns
    low = pd.DataFrame(math.nan, index=table.mean.index, columns=cols)
    high, p = low.copy(), low.copy()
    table.gain_low, table.gain_high, table.p_holm = low, high, p
    if runs.empty:
        return
    ids = sorted(set(runs["run_id"]))
    # only the table's runs: DuckDB pushes a list_contains filter down to the pairs before their samples are joined
    pairs = db.df("SELECT run_id, baseline_run, helped, hurt, n, gain FROM paired "
                  "WHERE gain IS NOT NULL AND list_contains($ids::VARCHAR[], run_id)", {"ids": ids})
    pairs = pairs[pairs["baseline_run"].isin(ids)]
    own = runs[["run_id", "backbone", "row", "key", "seed"]].assign(
        order=runs["order_index"].fillna(0) if "order_index" in runs else 0)
    paired = own.merge(pairs, on="run_id")
    if paired.empty:
        return
    label_of = dict(layout.datasets)
    rows = {(k[0], k[1]): k for k in table.mean.index if len(k) == 2 or k[2] == "measured"}
    raw: dict[tuple[Any, str], float] = {}
    for (backbone, row), part in paired.groupby(["backbone", "row"], sort=False):
        key = rows.get((backbone, row))
        if key is None:
            continue
        # one gain per dataset, seed and order (several sweeps with the same setting averaged), as the cells
        per_seed = part.groupby(["key", "seed", "order"])["gain"].mean().unstack("key")
        groups = [(label_of[k], (k,)) for k in per_seed.columns if k in label_of]
        groups += [(label, keys) for label, keys in layout.averages if all(k in per_seed.columns for k in keys)]
        for label, keys in groups:
            values = per_seed[list(keys)].dropna().mean(axis=1)
            if not len(values):
                continue
            used = part[part["key"].isin(keys)].set_index(["seed", "order"]).loc[lambda f: f.index.isin(values.index)]
            # gains in points here, fractions in stats
            summary = stats.across_runs(values.to_numpy() / 100, used["helped"], used["hurt"], used["n"])
            low.at[key, label], high.at[key, label] = 100 * summary.ci_low, 100 * summary.ci_high
            raw[(key, label)] = summary.p
    adjusted = stats.holm(list(raw.values()))
    for (key, label), value in zip(raw, adjusted):
        p.at[key, label] = value
    if raw:
        table.notes.append(f"{SIGNIFICANT} gain over CLIP significant at {stats.ALPHA:g} after Holm's correction over "
                           f"this table's {len(raw)} tested cells; [low, high]: its 95% interval "
                           "(docs/statistics.md)")


def _best(mean: pd.DataFrame, paper: bool, higher_is_better: bool) -> pd.DataFrame:
    best = pd.DataFrame(False, index=mean.index, columns=mean.columns)
    if mean.empty:
        return best
    measured = mean[mean.index.get_level_values(-1) == "measured"] if paper else mean
    for _backbone, block in measured.groupby(level=0, sort=False):
        for col in mean.columns:
            top = block[col].max() if higher_is_better else block[col].min()
            if not _is_missing(top):
                best.loc[block.index[block[col] == top], col] = True
    return best


def generic_layout(datasets: Sequence[str], title: str = "By method and dataset") -> Layout:
    """Columns for the datasets given (benchmark order first, then by name), plus Average when there are several."""
    def order(d: str) -> tuple[int, str]:
        key = registry.dataset_key(d)
        keys = [k for k, _ in _OOD + _CD]
        return (keys.index(key), d) if key else (len(keys), d)

    ordered = sorted(dict.fromkeys(datasets), key=order)
    cols = tuple((d, registry.dataset_title(d)) for d in ordered)
    averages = (("Average", tuple(ordered)),) if len(ordered) > 1 else ()
    return Layout("generic", title, cols, averages)


def method_dataset_table(results: ResultsDB | str | Path | None, sweep: str | None = None,
                         title: str | None = None, metric: str = "accuracy") -> ReportTable:
    """Method x dataset accuracy (mean ± std over seeds) for any sweep: the sweep's end summary and the demo.

    `results` is a ResultsDB or a results dir. `.to_frame()` gives the numbers, `.render()` a rich table.
    """
    db = results if isinstance(results, ResultsDB) else ResultsDB(results)
    runs = finished_runs(db, sweep)
    layout = generic_layout(list(runs["dataset"].unique()),
                            title or f"By method and dataset{f' — sweep {sweep}' if sweep else ''}")
    return build_table(db, layout, sweep=sweep, runs=runs, metric=metric)


def report_tables(db: ResultsDB, sweep: str | None = None, paper: bool = False, runs: pd.DataFrame | None = None,
                  include_empty: bool | None = None, metric: str = "accuracy") -> list[ReportTable]:
    """The comparison tables of `bca report` and the dashboard: Table 1 and Table 2 where they have measured
    cells, then a method x dataset table for datasets outside both (e.g. synthetic scenarios).

    runs: accuracy rows to tabulate (default: the finished runs, of `sweep` if given); include_empty: also the
    paper tables without measured cells, the published rows alone (default: with paper=True)."""
    runs = finished_runs(db, sweep) if runs is None else runs
    include_empty = paper if include_empty is None else include_empty
    keys = {registry.dataset_key(d) for d in runs["dataset"]}
    tables = []
    for layout in PAPER_LAYOUTS:
        if include_empty or keys & {k for k, _ in layout.datasets}:
            tables.append(build_table(db, layout, sweep=sweep, paper=paper, runs=runs, metric=metric))
    others = [d for d in runs["dataset"].unique() if registry.dataset_key(d) is None]
    if others:
        layout = generic_layout(others, "Other datasets, by method and dataset")
        tables.append(build_table(db, layout, sweep=sweep, runs=runs, metric=metric))
    return tables
