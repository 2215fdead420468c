"""Tables from stored results: the paper's Table 1 (OOD) and Table 2 (cross-domain), and a generic
method x dataset table for any sweep (synthetic scenarios included).

Every number says what it stands on (orchestrator.results.evidence): a cell is mean ± std over the finished runs
with all their rows (seeds x orders), "(n=3)"; where some of the runs it should stand on failed, were interrupted,
lost a part or never ran, "(n=2 of 3)" and the caption names each; where runs skipped images, "30 of 40 samples".
An average column is computed per (seed, order) over those that cover all of its datasets. Gains over CLIP are
paired: each run minus zero-shot CLIP on the same setting, seed, order and samples, averaged over the pairs.
"Best" compares complete cells of one backbone and one stream protocol; a published number is compared only with
a cell on the published protocol and the complete dataset (the dataset card's image count). Missing cells are NaN
in frames and "—" when rendered, never zero. Rows are (backbone, method); when one method was run with several
settings on a dataset (an hparam grid, several sweeps, streams), the settings that vary label separate rows, e.g.
"BCA (tau=0.3)"; a stream that differs anywhere in the table is named on every row.

Only runs of the published weights (run config `pretrained: openai`, which a checkpoint gets only when its file
is OpenAI's published one) are set beside the published numbers. Other weights are labelled so wherever they
appear: their backbone reads "RN50 (random weights)", "RN50 (checkpoint x.pt 1a2b3c4d)" (its sha256, short) or
"ViT-B/16 (<tag>)" in the tables, and the dashboard's series say "[random weights]", "[checkpoint x.pt 1a2b3c4d]"
or "[<tag>]". A prompt-tuning run started from a learned context reads "TPT [context 1a2b3c4d]" (the context
file's sha256, short), a row apart from the hand-written prompt's.
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

import numpy as np
import pandas as pd
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from orchestrator import registry
from orchestrator.registry.backbones import backbone_card
from orchestrator.registry.corruptions import BENCHMARKS, CORRUPTIONS, continual_variants, parse_variant, variant_name
from orchestrator.results import evidence, metrics, schema, stats
from orchestrator.results.db import ResultsDB
from orchestrator.results.labels import fmt_value, follows
from orchestrator.results.schema import RANDOM_WEIGHTS

MISSING = "—"
SIGNIFICANT = "*"  # on a cell whose gain over the row's baseline is significant (`_significance`)
PAPER_FILE = "paper_results.json"


def wide_console(file: Any = None, fit: Sequence[Any] = ()) -> Console:
    """A console wide enough for the paper's tables (piped output defaults to 80 columns, which folds them), and
    for each renderable in `fit` (the report's tables) as wide as it is whole: a table wider than its console cuts
    its cells short ("…"), digits included; a terminal narrower than the table wraps its lines instead."""
    console = Console(file=file, width=max(240, shutil.get_terminal_size().columns))
    unbounded = console.options.update_width(2**20)  # a measurement is capped at the width it is given
    need = max((Measurement.get(console, unbounded, r).maximum for r in fit), default=0)
    console.width = max(console.width, need)
    return console


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

RANDOM_WEIGHTS_NOTE = "random weights"
PUBLISHED_WEIGHTS = "openai"  # the tag of the weights the paper's numbers were measured with
SHORT_SHA = 8  # hex digits of a checkpoint's or context's sha256 that labels show


def weights_note(pretrained: Any) -> str | None:
    """What a backbone's label says about its weights: nothing for the published ones (and for synthetic runs,
    which have none), else 'random weights', 'checkpoint <file name>' or the tag."""
    if not isinstance(pretrained, str) or pretrained == PUBLISHED_WEIGHTS:
        return None
    if pretrained == RANDOM_WEIGHTS:
        return RANDOM_WEIGHTS_NOTE
    if "/" in pretrained or "\\" in pretrained or Path(pretrained).suffix in (".pt", ".pth", ".bin", ".safetensors"):
        return f"checkpoint {Path(pretrained).name}"
    return pretrained


# The per-run metrics a table can show (the registry: orchestrator.results.metrics).
METRICS = {m.name: m for m in metrics.RUN_METRICS}

# Run settings that may tell rows of one method apart (besides every hparam column).
_VARIANT_CANDIDATES = ("sweep", "pretrained", "templates", "num_templates", "views", "stream", "batch_size")
_NAMED_WHEREVER_IT_VARIES = ("stream", "batch_size")


def backbone_label(name: str) -> str:
    """open_clip names to the paper's: a backbone record's label (ViT-B-16 -> ViT-B/16, ViT-B-16-SigLIP -> SigLIP
    ViT-B/16), else ViT-X-n -> ViT-X/n; RN50-quickgelu -> RN50."""
    base = re.sub(r"-quickgelu$", "", name, flags=re.IGNORECASE)
    record = backbone_card(base)
    if record is not None:
        return record.label
    m = re.match(r"^(ViT-[A-Za-z]+)-(\d+)$", base)
    return f"{m.group(1)}/{m.group(2)}" if m else base


def load_paper_results() -> dict[str, Any]:
    """The published numbers (with their source), as carried in paper_results.json."""
    text = resources.files("orchestrator.results").joinpath(PAPER_FILE).read_text(encoding="utf-8")
    return json.loads(text)


# ------------------------------------------------------------------------------------------------- data
# Columns of the runs view a table's evidence needs besides the accuracy view's, and the cost table's.
_EVIDENCE_COLUMNS = ("n_skipped", "data_fingerprint", "error")
# What a lost run's row from its runs file does not bring into a table: what its rows said (they are not read).
_NOT_IDENTITY = {c.name for c in schema.METRIC_COLUMNS} | {"status", "n_rows", "n_distinct", "complete", "n_ood"}
COST_COLUMNS = ("latency_ms", "method_mem_mb")


def recorded_runs(db: ResultsDB, sweep: str | None = None) -> pd.DataFrame:
    """Every recorded run (of `sweep`, if given), whatever its status: the accuracy view's row where it has samples
    (metrics from its rows, `complete`), the runs view's where it has none, and status 'lost' for the runs the
    store committed that no view reads (`ResultsDB.lost`, where a file still holds their runs-table row). A table
    counts the finished, complete ones and marks its cells by the others (`evidence`). Rows whose runs-table row
    is gone have no seed or setting to be counted under: left out, and named by `ResultsDB.lost`."""
    where = " WHERE status IS NOT NULL" + (" AND sweep = $sweep" if sweep is not None else "")
    params = {"sweep": sweep} if sweep is not None else None
    extra = ", ".join(f'r."{c}"' for c in (*_EVIDENCE_COLUMNS, *COST_COLUMNS))
    accuracy = db.columns("accuracy")
    used = set(db.used_hparam_names)
    # hparams no run has (other methods'): left out, as empty columns of 10^5 runs cost seconds in pandas
    unused = [c for c in db.hparam_names if c not in used and c in accuracy]
    carried = set(accuracy) - set(unused)
    bare = ", ".join(f'"{c}"' for c in db.columns("runs")
                     if c in carried and c not in METRICS and c not in ("n_ood", "n_rows", "n_distinct", "complete"))
    exclude = " EXCLUDE (" + ", ".join(f'"{c}"' for c in unused) + ")" if unused else ""
    runs = db.df(f"""
SELECT * FROM (
    SELECT a.*{exclude}, {extra} FROM accuracy a LEFT JOIN runs r USING (run_id)
    UNION ALL BY NAME
    SELECT {bare}, {extra}, 0 AS n_rows, false AS complete FROM runs r
    WHERE run_id NOT IN (SELECT run_id FROM accuracy)
){where} ORDER BY backbone, method, dataset, seed, run_id""", params)
    identity = [c for c in runs.columns if c not in METRICS and c not in _NOT_IDENTITY]
    lost = [{**{c: row.get(c) for c in identity}, "status": "lost", "error": found.why,
             "n_rows": 0, "complete": False}
            for found in db.lost(sweep) for row in found.rows if sweep is None or row.get("sweep") == sweep]
    return pd.concat([runs, pd.DataFrame(lost)], ignore_index=True) if lost else runs



def per_value(values: pd.Series, fn: Any) -> pd.Series:
    """fn of each row's value, called once per distinct value (a study's 10^5 runs have a few backbones and
    methods); None and NaN are one missing value, which fn gets as None."""
    codes, uniques = pd.factorize(values, use_na_sentinel=True)
    missing = [fn(None)] if (codes < 0).any() else [None]
    mapped = np.array([fn(_plain(v)) for v in uniques] + missing, dtype=object)  # code -1: the missing value
    return pd.Series(mapped[codes], index=values.index, dtype=object)


def row_labels(runs: pd.DataFrame, hparams: Sequence[str], extra: Sequence[str] = ()) -> pd.Series:
    """A label per run naming its configuration apart from the seed: the method's label, plus the settings
    that vary between its runs of one backbone and dataset, e.g. "BCA (tau=0.3)" (the tables' rows, the
    dashboard's series); a run of other than the published weights says which (`weights_note`)."""
    labels = _with_context_note(runs, _row_labels(runs, hparams, extra)[0])
    if "pretrained" in runs.columns:
        notes = weights_notes(runs)
        labels = labels.where(notes.isna(), labels + " [" + notes.fillna("") + "]")
    return labels


def weights_notes(runs: pd.DataFrame) -> pd.Series:
    """Each run's `weights_note`, a checkpoint's followed by its content hash (short): two fine-tunings saved under
    one file name are two starting points."""
    notes = per_value(runs["pretrained"], weights_note)
    if "weights_sha256" in runs.columns:
        sha = runs["weights_sha256"]
        notes = notes.where(notes.isna() | sha.isna(), notes + " " + _short_sha(sha))
    return notes


def _with_context_note(runs: pd.DataFrame, labels: pd.Series) -> pd.Series:
    """A run started from a learned context says so on its row, "TPT [context 1a2b3c4d]" (its file's sha256,
    short), and one aligned with PromptAlign's source statistics too ("[context 1a2b3c4d, statistics 5e6f7a8b
    9c0d1e2f]": the means' and the variances' files): rows of the hand-written prompt, of each context and of each
    statistics pair never merge."""
    if "context_sha256" not in runs.columns:
        return labels
    sha = runs["context_sha256"]
    note = " [context " + _short_sha(sha)
    if {"vis_means_sha256", "vis_vars_sha256"} <= set(runs.columns):
        means, variances = runs["vis_means_sha256"], runs["vis_vars_sha256"]
        note = note.where(means.isna(), note + ", statistics " + _short_sha(means) + " " + _short_sha(variances))
    return labels.where(sha.isna(), labels + note + "]")


def _short_sha(sha: pd.Series) -> pd.Series:
    """Each hash's first SHORT_SHA hex digits (object dtype, as the labels it is added to)."""
    return per_value(sha, lambda v: None if v is None else str(v)[:SHORT_SHA]).fillna("")


def _row_labels(runs: pd.DataFrame, hparams: Sequence[str], extra: Sequence[str]) -> tuple[pd.Series, list[str]]:
    candidates = [c for c in (*extra, *_VARIANT_CANDIDATES, *hparams, "group_id") if c in runs.columns]
    if runs.empty:
        return per_value(runs["method"], registry.method_label), []
    # labelled once per distinct configuration and dataset, then given to its runs (seeds x orders of each: a
    # study's 10^5 runs are a few hundred configurations); every rule below reads distinct values only
    codes = runs.groupby(["backbone", "method", "dataset", *candidates], dropna=False, sort=False).ngroup().to_numpy()
    _, first = np.unique(codes, return_index=True)
    labels, split = _configuration_labels(runs.iloc[first].reset_index(drop=True), candidates)
    return pd.Series(labels.to_numpy(dtype=object)[codes], index=runs.index, dtype=object), split


def _configuration_labels(runs: pd.DataFrame, candidates: list[str]) -> tuple[pd.Series, list[str]]:
    labels = per_value(runs["method"], registry.method_label)
    # distinct values of each setting per (backbone, method, dataset) and starting context (its rows are told apart
    # by `_with_context_note`), then the most any of them has
    within = ["backbone", "method", "dataset", *(c for c in schema.STARTING_POINT if c in runs.columns)]
    distinct = runs.groupby(within, dropna=False)[candidates].nunique(dropna=False)
    most = distinct.groupby(level=["backbone", "method"]).max()
    # a stream or batch size that differs anywhere is named on every row: rows of different protocols are not
    # comparable
    everywhere = [c for c in _NAMED_WHEREVER_IT_VARIES if c in candidates and runs[c].nunique(dropna=False) > 1]
    split: set[str] = set()
    for (backbone, method), counts in most.iterrows():
        vary = [c for c in candidates if c != "group_id" and (counts[c] > 1 or c in everywhere)]
        if not vary and "group_id" in counts and counts["group_id"] > 1:
            vary = ["group_id"]  # configs differ only in keys without a column (e.g. synthetic parameters)
        part = runs[(runs["backbone"] == backbone) & (runs["method"] == method)]
        vary = [c for c in vary if not follows(part, method, c, vary)]
        if vary:
            split.update(vary)
            name, texts = registry.method_label(method), {}
            rows = list(zip(*(part[c].to_numpy(dtype=object) for c in vary)))
            for values in rows:
                if values not in texts:  # formatted once per configuration, not once per dataset
                    texts[values] = f"{name} (" + ", ".join(f"{c}={fmt_value(_plain(v), c)}"
                                                            for c, v in zip(vary, values)) + ")"
            labels.loc[part.index] = [texts[values] for values in rows]
    return labels, sorted(split)


def _plain(value: Any) -> Any:
    """numpy scalars as Python ones, so 0.3 prints as 0.3."""
    return value.item() if hasattr(value, "item") else value


def _with_row_labels(runs: pd.DataFrame, hparams: Sequence[str]) -> tuple[pd.DataFrame, list[str]]:
    """Display backbones, and a 'row' label per run (`row_labels`); returns the frame and the names of the
    settings that split rows."""
    runs = runs.copy()
    runs["backbone_name"] = runs["backbone"]
    runs["backbone"] = per_value(runs["backbone"], backbone_label)
    if "pretrained" in runs.columns:
        notes = weights_notes(runs)
        runs["backbone"] = runs["backbone"].where(notes.isna(), runs["backbone"] + " (" + notes.fillna("") + ")")
    runs["row"], split = _row_labels(runs, hparams, ("backbone_name",))
    runs["row"] = _with_context_note(runs, runs["row"])
    return runs, split


@dataclass
class ReportTable:
    """One rendered table. Frames are indexed by (backbone, method[, source]) with one column per table column.

    mean / std / n: over the runs (seeds x orders) a cell stands on; expected: the runs it should stand on (n <
    expected: some are missing or incomplete, `evidence`); best: the best complete measured cell of each column
    among the rows of one backbone and stream protocol; gain / gain_n: the paired gain over zero-shot CLIP and the
    (seed, order) pairs it stands on; cells: each measured cell's evidence; source rows 'paper' and 'Δ paper'
    only with paper=True ('Δ paper' only where the cell is the published protocol on the complete dataset).
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
    expected: pd.DataFrame | None = None
    gain_n: pd.DataFrame | None = None
    cells: dict[tuple, dict[str, evidence.Cell]] = field(default_factory=dict)
    gain_cells: dict[tuple, dict[str, evidence.Cell]] = field(default_factory=dict)
    # the gain over the row's baseline with evidence (accuracy tables; `_significance`): its 95% interval and
    # Holm-adjusted p-value per cell, NaN where not tested
    gain_low: pd.DataFrame | None = None
    gain_high: pd.DataFrame | None = None
    p_holm: pd.DataFrame | None = None
    gain_evidence: pd.DataFrame | None = None  # one row per tested cell (EVIDENCE_COLUMNS), the family of p_holm
    # each row's method id (the index holds display labels, which two methods may share a prefix of)
    methods: pd.Series | None = None

    def significant(self, key: Any, col: str) -> bool:
        return self.p_holm is not None and bool(self.p_holm.at[key, col] <= stats.ALPHA)

    @property
    def empty(self) -> bool:
        return self.mean.empty

    def to_frame(self) -> pd.DataFrame:
        """Numbers as a flat frame: '<column>' (mean), '<column> std', '<column> n', '<column> n expected', then
        'Δ CLIP (<column>)' and its 'Δ CLIP (<column>) n' pairs."""
        out: dict[str, pd.Series] = {}  # framed once: a frame grown column by column is slow to build and use
        for col in self.columns:
            out[col] = self.mean[col]
            out[f"{col} std"] = self.std[col]
            out[f"{col} n"] = self.n[col]
            if self.expected is not None:
                out[f"{col} n expected"] = self.expected[col]
        for col in self.gain_columns:
            out[f"Δ CLIP ({col})"] = self.gain[col]
            if self.gain_n is not None:
                out[f"Δ CLIP ({col}) n"] = self.gain_n[col]
        if self.p_holm is not None:
            for col in self.columns:
                out[f"Δ CLIP ({col}) low"] = self.gain_low[col]
                out[f"Δ CLIP ({col}) high"] = self.gain_high[col]
                out[f"Δ CLIP ({col}) p Holm"] = self.p_holm[col]
        return pd.DataFrame({k: v.to_numpy() for k, v in out.items()}, index=self.mean.index)

    def formatted(self) -> pd.DataFrame:
        """Display strings: 'mean ± std (n=3)' (the mean alone for one run), 'n=2 of 3' where runs are missing,
        '30 of 40 samples' where images were skipped, signed paired gains with their pairs, '—' for missing."""
        out: dict[str, list[str]] = {}
        sources = (list(self.mean.index.get_level_values("source")) if "source" in self.mean.index.names
                   else ["measured"] * len(self.mean))
        keys = list(self.mean.index)
        # columns as plain lists, read by position (a MultiIndex lookup per cell costs a study's table seconds)
        plain = lambda frame, col: None if frame is None else frame[col].tolist()  # noqa: E731
        for col in self.columns:
            means, stds, ns = plain(self.mean, col), plain(self.std, col), plain(self.n, col)
            p_holm = plain(self.p_holm, col)
            out[col] = [_cell(means[i], stds[i], ns[i], source, self.cells.get(key, {}).get(col))
                        + (SIGNIFICANT if p_holm is not None and p_holm[i] <= stats.ALPHA else "")
                        for i, (key, source) in enumerate(zip(keys, sources))]
        for col in self.gain_columns:
            gains, lows, highs = plain(self.gain, col), plain(self.gain_low, col), plain(self.gain_high, col)
            out[f"Δ CLIP ({col})"] = [evidence.gain_text(gains[i], self.gain_cells.get(key, {}).get(col))
                                      + _interval(lows, highs, i) for i, key in enumerate(keys)]
        return pd.DataFrame(out, index=self.mean.index)

    def render(self) -> Table:
        """A rich table; the best complete measured cell per column, backbone and stream protocol in bold."""
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


def _cell(mean: Any, std: Any, n: Any, source: str, cell: evidence.Cell | None = None) -> str:
    if source == "Δ paper":
        return _signed(mean)
    if source == "paper":
        return MISSING if _is_missing(mean) else f"{mean:.2f}"
    if cell is None:
        return MISSING if _is_missing(mean) else evidence.cell_text(mean, std, int(n))
    return evidence.cell_text(mean, std, cell.n, len(cell.expected), cell.samples, cell.total)


def _signed(value: Any) -> str:
    return MISSING if _is_missing(value) else f"{value:+.2f}"


def _with_clip_values(runs: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Each run with `_clip`: zero-shot CLIP's value on the very same samples: the usable CLIP run of the same
    setting (backbone, data, templates, views, stream), seed and order, with the same stream length and data
    fingerprint (NaN where there is none)."""
    runs = evidence.prepare(runs)
    if "setting_id" not in runs:
        return runs.assign(_clip=math.nan)
    keys = ["setting_id", "seed", "_order", "_n", "_fp"]
    keyed = runs.assign(_n=runs["n_samples"].fillna(-1),
                        _fp=runs["data_fingerprint"].fillna("") if "data_fingerprint" in runs else "")
    clip = keyed[keyed["_fit"] & (keyed["method"] == registry.baseline_method())]
    values = clip.groupby(keys)[metric].mean().rename("_clip").reset_index()
    return keyed.merge(values, on=keys, how="left").set_axis(runs.index).drop(columns=["_n", "_fp"])
def _interval(lows: list | None, highs: list | None, i: int) -> str:
    if lows is None or _is_missing(lows[i]):
        return ""
    return f" [{lows[i]:+.2f}, {highs[i]:+.2f}]"


def _aggregate(runs: pd.DataFrame, layout: Layout, metric: str
               ) -> tuple[dict[tuple[str, str, str], dict[str, evidence.Cell]],
                          dict[tuple[str, str, str], dict[str, evidence.Cell]]]:
    """({(backbone, method, row): {column label: cell}}, the same for the paired gains over CLIP) for the layout's
    dataset and average columns, from every recorded run of the table (any status; `evidence` decides what a cell
    stands on)."""
    cells: dict[tuple[str, str, str], dict[str, evidence.Cell]] = {}
    gains: dict[tuple[str, str, str], dict[str, evidence.Cell]] = {}
    label_of = dict(layout.datasets)
    runs = evidence.prepare(runs)
    peers = evidence.expected_keys(runs)
    runs = _with_clip_values(runs, metric)
    arrays = evidence.columns(runs)
    values = pd.to_numeric(runs[metric], errors="coerce").to_numpy(dtype=float)
    paired = values - runs["_clip"].to_numpy(dtype=float)
    for (backbone, method, row, key), at in runs.groupby(["backbone", "method", "row", "key"], sort=False).indices.items():
        cells.setdefault((backbone, method, row), {})[label_of[key]] = evidence.cell_at(runs, arrays, values, at, peers)
        gains.setdefault((backbone, method, row), {})[label_of[key]] = evidence.cell_at(
            runs, arrays, paired, at, peers, "no complete CLIP run on the same samples to pair with")
    for row_key, own in cells.items():
        for label, keys in layout.averages:
            if all(label_of[k] in own for k in keys):
                own[label] = evidence.average_cell([own[label_of[k]] for k in keys])
                gains[row_key][label] = evidence.average_cell([gains[row_key][label_of[k]] for k in keys])
    return cells, gains


def _stats(cell: evidence.Cell | None) -> tuple[float, float, int]:
    return (math.nan, math.nan, 0) if cell is None else cell.stats()


def build_table(db: ResultsDB, layout: Layout, sweep: str | None = None, paper: bool = False,
                runs: pd.DataFrame | None = None, metric: str = "accuracy") -> ReportTable:
    """The layout's table from the recorded runs (of `sweep`, if given; or the accuracy-view rows in `runs`). Cells
    stand on the finished, complete runs and say how many of the expected ones that is (`evidence`); paper=True
    adds the published rows ('paper') and measured minus published ('Δ paper') under each (backbone, method)."""
    runs = recorded_runs(db, sweep) if runs is None else runs
    keys = {k for k, _ in layout.datasets}
    runs = runs.assign(key=runs["dataset"] if layout.key == "generic" else per_value(runs["dataset"],
                                                                                     registry.dataset_key))
    runs = runs[runs["key"].isin(keys)]
    hparams = db.used_hparam_names
    runs, split = _with_row_labels(runs, hparams)
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of: {', '.join(METRICS)}")
    cells, gain_cells = _aggregate(runs, layout, metric) if len(runs) else ({}, {})
    columns = layout.columns
    datasets, averages = [label for _, label in layout.datasets], [label for label, _ in layout.averages]
    # the paper's tables give the gain on their averages, the headline; a table of other datasets gives it on each
    # dataset too: they are separate results (a gain that holds on one dataset and not another shows), not one
    # benchmark
    gain_columns = datasets + averages if layout.key == "generic" else averages or datasets

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

    index, methods, means, stds, ns, expected, gains, gain_ns = [], [], [], [], [], [], [], []
    by_index, gain_by_index = {}, {}
    not_compared = 0
    for backbone, method, row in row_keys:
        own = cells.get((backbone, method, row), {})
        measured = {c: _stats(own.get(c)) for c in columns}
        own_gain = gain_cells.get((backbone, method, row), {})
        paired = {c: _stats(own_gain.get(c)) for c in columns}
        sources = [("measured", measured)]
        published = paper_rows.get((backbone, method))
        if published is not None:
            paper_source = ("paper", {c: (published.get(c, math.nan), math.nan, 1) for c in columns})
            comparable = {c: c in own and own[c].paper_ok and c in published for c in columns}
            not_compared += sum(1 for c in columns if c in own and c in published and not comparable[c])
            sources = [paper_source] if method in published_only else [*sources, paper_source, (
                "Δ paper", {c: (measured[c][0] - published[c] if comparable[c] else math.nan, math.nan, 1)
                            for c in columns})]
        for source, values in sources:
            key = (backbone, row, source) if paper else (backbone, row)
            index.append(key)
            methods.append(method)
            means.append({c: values[c][0] for c in columns})
            stds.append({c: values[c][1] for c in columns})
            ns.append({c: values[c][2] for c in columns})
            is_measured = source == "measured"
            expected.append({c: len(own[c].expected) if is_measured and c in own else 0 for c in columns})
            gains.append({c: paired[c][0] if is_measured else math.nan for c in columns})
            gain_ns.append({c: paired[c][2] if is_measured else 0 for c in columns})
            if is_measured:
                by_index[key], gain_by_index[key] = own, own_gain
    names = ["backbone", "method", "source"] if paper else ["backbone", "method"]
    idx = pd.MultiIndex.from_tuples(index, names=names) if index else pd.MultiIndex.from_tuples([], names=names)
    mean = pd.DataFrame(means, index=idx, columns=columns, dtype=float)
    std = pd.DataFrame(stds, index=idx, columns=columns, dtype=float)
    n = pd.DataFrame(ns, index=idx, columns=columns).fillna(0).astype(int)
    expected_frame = pd.DataFrame(expected, index=idx, columns=columns).fillna(0).astype(int)
    gain = pd.DataFrame(gains, index=idx, columns=columns, dtype=float)
    gain_n = pd.DataFrame(gain_ns, index=idx, columns=columns).fillna(0).astype(int)
    best = _best(mean, by_index, METRICS[metric].higher_is_better)
    all_cells = [c for own in by_index.values() for c in own.values()]
    notes[:0] = _evidence_notes(by_index, all_cells, [label for _, label in layout.datasets])
    if not_compared:
        notes.append(f"Δ paper left out of {not_compared} cell(s): a published number is compared only with the "
                     "published protocol (an i.i.d. stream) on the complete dataset (every run, no skipped image, "
                     "the dataset card's image count)")
    if split:
        notes.append(f"rows split by settings that vary within a dataset: {', '.join(split)}")
    notes += _best_of_notes(runs)
    table = ReportTable(f"{layout.title}, {METRICS[metric].label}", columns, gain_columns, mean, std, n, gain, best,
                        notes, expected_frame, gain_n, by_index, gain_by_index,
                        methods=pd.Series(methods, index=idx, dtype=object))
    if metric == "accuracy":  # the tests are of top-1 accuracy: helped against hurt on the same samples
        _significance(db, table, runs, layout)
    return table


# The evidence of a table's tested cells, one row each (ReportTable.gain_evidence): what its star stands on.
EVIDENCE_COLUMNS = ["backbone", "series", "method", "column", "dataset", "runs", "gain", "low", "high", "test", "p",
                    "p_holm", "significant"]


def _significance(db: ResultsDB, table: ReportTable, runs: pd.DataFrame, layout: Layout) -> None:
    """Each measured cell's gain over CLIP with evidence, from the paired view's runs (each against CLIP on the
    same samples, seed and order; both finished and complete): stats.across_runs over the cell's runs, each
    (seed, order) a replicate and each dataset a test set (an average column: the (seed, order) pairs that cover
    all its datasets). The table's tested cells are one Holm family, here and wherever the table is shown (the
    dashboard's evidence table is `table.gain_evidence`), and the legend says so."""
    index, cols = table.mean.index, table.columns
    # filled cell by cell in dicts, framed once at the end (setting a frame's cells one by one costs a study's
    # table seconds)
    low: dict[tuple[Any, str], float] = {}
    high: dict[tuple[Any, str], float] = {}
    raw: dict[tuple[Any, str], float] = {}
    rows_out: list[dict[str, Any]] = []

    def frame(values: dict[tuple[Any, str], float]) -> pd.DataFrame:
        out = pd.DataFrame(math.nan, index=index, columns=cols)
        if values:
            at = {k: i for i, k in enumerate(index)}
            grid = out.to_numpy(copy=True)
            for (key, label), value in values.items():
                grid[at[key], cols.index(label)] = value
            out = pd.DataFrame(grid, index=index, columns=cols)
        return out

    def publish() -> None:
        adjusted = stats.holm(list(raw.values()))
        table.gain_low, table.gain_high = frame(low), frame(high)
        table.p_holm = frame(dict(zip(raw, adjusted)))
        evidence_rows = pd.DataFrame(rows_out, columns=EVIDENCE_COLUMNS)
        evidence_rows["p_holm"] = adjusted
        evidence_rows["significant"] = evidence_rows["p_holm"] <= stats.ALPHA
        table.gain_evidence = evidence_rows

    runs = evidence.prepare(runs)
    runs = runs[runs["_fit"]]  # finished with all their rows, as the cells they qualify
    if runs.empty:
        return publish()
    # every pair, kept to the table's runs by the merge below (binding the table's 10^5 ids into the query costs
    # more than reading the pairs of runs it does not show)
    pairs = db.paired_gains()
    known = set(runs["run_id"].to_numpy(dtype=object))
    pairs = pairs[np.array([b in known for b in pairs["baseline_run"].to_numpy(dtype=object)], dtype=bool)]
    own = runs[["run_id", "backbone", "method", "dataset", "row", "key", "seed"]].assign(
        order=runs["order_index"].fillna(0) if "order_index" in runs else 0)
    paired = own.merge(pairs, on="run_id")
    if paired.empty:
        return publish()
    rows = {(k[0], k[1]): k for k in table.mean.index if len(k) == 2 or k[2] == "measured"}
    # per (backbone, row) and dataset: the positions of its paired runs; one groupby for the whole table, then
    # plain lists per cell (a study's table has hundreds of cells over 10^5 runs)
    by_row: dict[tuple[Any, Any], dict[str, np.ndarray]] = {}
    for (backbone, row, k), at in paired.groupby(["backbone", "row", "key"], sort=False).indices.items():
        by_row.setdefault((backbone, row), {})[k] = at
    counts = paired[["helped", "hurt", "n"]].to_numpy(dtype=np.int64)
    replicates = list(zip(paired["seed"].tolist(), paired["order"].tolist()))
    datasets, methods, names = paired["key"].tolist(), paired["method"].tolist(), paired["dataset"].tolist()
    for (backbone, row), key in rows.items():  # in the table's order, rows and columns
        by_key = by_row.get((backbone, row))
        if by_key is None:
            continue
        groups = [(label, (k,)) for k, label in layout.datasets if k in by_key]
        groups += [(label, keys) for label, keys in layout.averages if all(k in by_key for k in keys)]
        for label, keys in groups:
            if len(keys) == 1:
                at = by_key[keys[0]].tolist()
            else:  # the (seed, order) pairs that cover every dataset of the column
                common = set.intersection(*({replicates[i] for i in by_key[k]} for k in keys))
                at = [i for k in keys for i in by_key[k].tolist() if replicates[i] in common]
            if not at:
                continue
            summary = stats.across_runs(counts[at, 0], counts[at, 1], counts[at, 2],
                                        [replicates[i] for i in at], [datasets[i] for i in at])
            # gains in points here, fractions in stats
            low[(key, label)], high[(key, label)] = 100 * summary.ci_low, 100 * summary.ci_high
            raw[(key, label)] = summary.p
            rows_out.append({"backbone": backbone, "series": row, "method": methods[at[0]], "column": label,
                             "dataset": names[at[0]] if len(keys) == 1 else None, "runs": summary.runs,
                             "gain": 100 * summary.mean, "low": low[(key, label)], "high": high[(key, label)],
                             "test": summary.test, "p": summary.p})
    publish()
    if raw:
        table.notes.append(f"{SIGNIFICANT} gain over CLIP significant at {stats.ALPHA:g} after Holm's correction over "
                           f"this table's {len(raw)} tested cells; [low, high]: its 95% interval over runs and test "
                           "samples (docs/statistics.md)")


def _best_of_notes(runs: pd.DataFrame) -> list[str]:
    """A method shown in several configurations on the same data and stream (a grid's rows): its best row is
    chosen on the very runs it is measured on, and the caption says so (`tuning` chooses on other runs)."""
    fit = evidence.prepare(runs) if len(runs) else runs
    if not len(fit) or "group_id" not in fit:
        return []
    fit = fit[fit["_fit"]]
    # runs from different starting contexts are rows apart (`_with_context_note`), not configurations to choose from
    context = [c for c in schema.STARTING_POINT if c in fit]
    counts = fit.groupby(["backbone", "method", "dataset", "_protocol", *context], sort=False,
                         dropna=not context)["group_id"].nunique()
    most = counts.groupby(level=["backbone", "method"], sort=False).max()
    lines = [f"{registry.method_label(method)} ({backbone}): best of {k} configurations, chosen on these runs"
             for (backbone, method), k in most.items() if k > 1]
    return ["; ".join(lines) + " (bca report --tune-on PREDICATE chooses on some runs and reports on the others)"
            ] if lines else []


def _evidence_notes(by_index: dict[tuple, dict[str, evidence.Cell]], cells: list[evidence.Cell],
                    dataset_columns: list[str]) -> list[str]:
    """The caption's account of what the cells stand on: the spread, the counts, every incomplete cell's missing
    runs and every cell short of samples."""
    if not cells:
        return []
    notes = [f"mean ± std over {evidence.spread_over(cells)}; n: the runs a cell stands on (finished, all rows); "
             "Δ CLIP: paired gain over zero-shot CLIP on the same seeds, orders and samples (n: pairs); best in "
             "bold among complete cells of one backbone and stream protocol"]
    missing, short = [], []
    for key, own in by_index.items():
        for col in dataset_columns:  # an average's missing runs are its datasets'
            cell = own.get(col)
            if cell is None:
                continue
            where = " · ".join([*map(str, key[:2]), col])
            missing.extend((where, k, why) for k, why in cell.missing.items())
            if cell.skipped:
                short.append(f"  {where}: {cell.samples:,} of {cell.total:,} samples (unreadable images skipped)")
    if missing:
        notes.append(f"n=k of m: {len(missing)} run(s) missing or incomplete; those cells stand on the others:")
        notes.extend(evidence.missing_lines(missing))
    if short:
        notes.append("cells on fewer samples than the dataset has:")
        notes.extend(short[:evidence.MAX_LISTED] + ([f"  ... and {len(short) - evidence.MAX_LISTED} more"]
                                                    if len(short) > evidence.MAX_LISTED else []))
    return notes


def _best(mean: pd.DataFrame, cells: dict[tuple, dict[str, evidence.Cell]], higher_is_better: bool) -> pd.DataFrame:
    """The best complete measured cell per column among the rows of one backbone and one stream protocol (a
    contaminated stream's accuracy is not comparable with an i.i.d. one's)."""
    at = {key: i for i, key in enumerate(mean.index)}
    grid = mean.to_numpy(dtype=float)
    best = np.zeros(grid.shape, dtype=bool)
    for j, col in enumerate(mean.columns):
        groups: dict[tuple, list[int]] = {}
        for key, own in cells.items():
            cell = own.get(col)
            if cell is not None and cell.complete and not _is_missing(grid[at[key], j]):
                groups.setdefault((key[0], tuple(sorted(cell.protocols))), []).append(at[key])
        for rows in groups.values():
            values = grid[rows, j]
            top = values.max() if higher_is_better else values.min()
            best[[i for i, v in zip(rows, values) if v == top], j] = True
    return pd.DataFrame(best, index=mean.index, columns=mean.columns)


def generic_layout(datasets: Sequence[str], title: str = "By method and dataset") -> Layout:
    """Columns for the datasets given (benchmark order first, then by name), plus Average when there are several."""
    paper = registry.paper_datasets()

    def order(d: str) -> tuple[int, str]:
        key = registry.dataset_key(d)
        return (paper.index(key), d) if key in paper else (len(paper), d)

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
    runs = recorded_runs(db, sweep)
    layout = generic_layout(list(runs["dataset"].unique()),
                            title or f"By method and dataset{f' — sweep {sweep}' if sweep else ''}")
    return build_table(db, layout, sweep=sweep, runs=runs, metric=metric)


# ------------------------------------------------------------------------------------- corruption benchmarks
ERROR_LABEL = "error (%) = 100 - top-1 accuracy"


def corruption_layout(benchmark: str, severity: int) -> Layout:
    """A corruption benchmark at one severity: a column per corruption (CoTTA's order), and their mean."""
    columns = tuple((variant_name(benchmark, c, severity), c) for c in CORRUPTIONS)
    return Layout(f"corruption:{benchmark}:{severity}", f"{BENCHMARKS[benchmark].title}, severity {severity}",
                  columns, (("Mean", tuple(k for k, _ in columns)),))


def _as_error(table: ReportTable) -> ReportTable:
    """An accuracy table as the corruption benchmarks report it, in error (100 - accuracy): means flipped, gains
    and their intervals negated (a gain of accuracy is a fall of error), the best cell the lowest. Its tested
    cells' evidence (`gain_evidence`, the dashboard's gain section) stays the gain of accuracy it is labelled."""
    table.title = table.title.replace(METRICS["accuracy"].label, ERROR_LABEL)
    table.mean = 100.0 - table.mean
    table.gain = 0.0 - table.gain  # 0.0 - x, not -x: no gain of 0 printed as -0.00
    if table.gain_low is not None:
        table.gain_low, table.gain_high = 0.0 - table.gain_high, 0.0 - table.gain_low
    table.best = _best(table.mean, table.cells, higher_is_better=False)
    table.notes.append("Δ CLIP: the change in error against zero-shot CLIP on the same samples (negative: fewer "
                       "errors)")
    return table


def continual_corruption_table(db: ResultsDB, runs: pd.DataFrame, benchmark: str, severity: int) -> ReportTable:
    """The continual corruption stream (one run through the corruptions in turn, the method's state carried
    across): each corruption's error over its segment of the run (the rows' `source`), and their mean, as mean ±
    std over the finished, complete runs (seeds x orders) of each (backbone, method)."""
    runs, _ = _with_row_labels(runs, db.used_hparam_names)
    runs = runs[(runs["status"] == "finished") & runs["complete"].fillna(False).astype(bool)]
    order = list(dict.fromkeys(d for name in runs["dataset"] for d in continual_variants(name)))
    labels = {name: parse_variant(name)[1] for name in order}
    columns = [labels[name] for name in order] + ["Mean"]
    segments = db.df("SELECT run_id, source, 100 * (1 - avg(correct::DOUBLE)) AS error FROM samples WHERE run_id IN "
                     "(SELECT unnest($ids)) AND NOT coalesce(is_ood, false) GROUP BY 1, 2",
                     {"ids": runs["run_id"].tolist()}) if len(runs) else pd.DataFrame(
                         columns=["run_id", "source", "error"])
    per_run = segments.pivot(index="run_id", columns="source", values="error").rename(columns=labels)
    per_run = per_run.reindex(columns=columns[:-1])
    per_run["Mean"] = per_run.mean(axis=1, skipna=False)  # the field's mean error: over the corruptions
    joined = runs.set_index("run_id")[["backbone", "row"]].join(per_run, how="inner")
    grouped = joined.groupby(["backbone", "row"], sort=False)[columns]
    mean, std, n = grouped.mean(), grouped.std(ddof=1), grouped.count()
    index = pd.MultiIndex.from_tuples(list(mean.index), names=["backbone", "method"])
    mean, std, n = (f.set_axis(index) for f in (mean, std, n))
    nan = pd.DataFrame(math.nan, index=index, columns=columns)
    table = ReportTable(f"{BENCHMARKS[benchmark].title}, severity {severity}, continual stream (one run through the "
                        f"corruptions in this order), {ERROR_LABEL}", columns, [], mean, std, n.astype(int), nan,
                        mean.eq(mean.min()) & mean.notna(),
                        ["each cell: the error over that corruption's segment of the run; ± over seeds x stream "
                         "orders"])
    return table


def report_tables(db: ResultsDB, sweep: str | None = None, paper: bool = False, runs: pd.DataFrame | None = None,
                  include_empty: bool | None = None, metric: str = "accuracy") -> list[ReportTable]:
    """The comparison tables of `bca report` and the dashboard: Table 1 and Table 2 where they have measured
    cells, then a method x dataset table for every other dataset (synthetic scenarios, registered and folder
    datasets that are not the paper's).

    runs: accuracy rows to tabulate (default: the finished runs, of `sweep` if given); include_empty: also the
    paper tables without measured cells, the published rows alone (default: with paper=True)."""
    runs = recorded_runs(db, sweep) if runs is None else runs
    include_empty = paper if include_empty is None else include_empty
    keys = {registry.dataset_key(d) for d in runs["dataset"].unique()}
    tables = []
    for layout in PAPER_LAYOUTS:
        if include_empty or keys & {k for k, _ in layout.datasets}:
            tables.append(build_table(db, layout, sweep=sweep, paper=paper, runs=runs, metric=metric))
    datasets = runs["dataset"].unique()
    # the corruption benchmarks: one table per (benchmark, severity) of their runs, and per continual stream
    for benchmark, severity in sorted({(p[0], p[2]) for p in map(parse_variant, datasets) if p}):
        table = build_table(db, corruption_layout(benchmark, severity), sweep=sweep, runs=runs, metric=metric)
        tables.append(_as_error(table) if metric == "accuracy" else table)
    continual = {d: continual_variants(d) for d in datasets}
    continual = {d: None if v is None else (parse_variant(v[0])[0], parse_variant(v[0])[2]) for d, v in continual.items()}
    for benchmark, severity in sorted({c for c in continual.values() if c} if metric == "accuracy" else ()):
        part = runs[runs["dataset"].map(lambda d: continual[d] == (benchmark, severity))]
        tables.append(continual_corruption_table(db, part, benchmark, severity))
    paper_keys = set(registry.paper_datasets())
    others = [d for d in datasets if registry.dataset_key(d) not in paper_keys and parse_variant(d) is None
              and continual[d] is None]
    if others:
        layout = generic_layout(others, "Other datasets, by method and dataset")
        tables.append(build_table(db, layout, sweep=sweep, runs=runs, metric=metric))
    return tables


# ------------------------------------------------------------------------------------------------- cost
@dataclass
class CostTable:
    """Accuracy against cost per method (the BCA paper's Table 3 shape): per backbone, dataset and row (`row_labels`),
    over the finished, complete runs: the metric's mean ± std and n, its paired gain over CLIP, the mean latency
    per sample and the mean method memory. `frame` holds the numbers, `render()` a rich table."""

    title: str
    frame: pd.DataFrame
    notes: list[str]
    metric: str

    @property
    def empty(self) -> bool:
        return self.frame.empty

    def render(self) -> Table:
        label = METRICS[self.metric].label
        table = Table(title=self.title, title_justify="left", header_style="bold")
        for name in ("backbone", "dataset", "method", label, "Δ CLIP", "latency (ms/sample)", "method memory (MB)"):
            table.add_column(Text(name), justify="left" if name in ("backbone", "dataset", "method") else "right",
                             no_wrap=True)
        previous = None
        for (backbone, dataset, row), r in self.frame.iterrows():
            if previous is not None and (backbone, dataset) != previous:
                table.add_section()
            previous = (backbone, dataset)
            table.add_row(Text(str(backbone)), Text(registry.dataset_title(dataset)), Text(str(row)),
                          Text(evidence.cell_text(r["mean"], r["std"], int(r["n"]))), Text(_signed(r["gain"])),
                          Text(MISSING if _is_missing(r["latency_ms"]) else f"{r['latency_ms']:.4g}"),
                          Text(MISSING if _is_missing(r["method_mem_mb"]) else f"{r['method_mem_mb']:.4g}"))
        table.caption = Text("\n".join(self.notes))
        table.caption_justify = "left"
        return table


def cost_table(db: ResultsDB, sweep: str | None = None, runs: pd.DataFrame | None = None,
               metric: str = "accuracy") -> CostTable:
    """The cost table of the recorded runs (of `sweep`, if given; or the accuracy-view rows in `runs`)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of: {', '.join(METRICS)}")
    runs = recorded_runs(db, sweep) if runs is None else runs
    runs, _ = _with_row_labels(runs, db.used_hparam_names)
    runs = _with_clip_values(runs, metric)
    runs = runs[runs["_fit"]]
    values = pd.to_numeric(runs[metric], errors="coerce")
    frame = runs.assign(_value=values, _gain=values - runs["_clip"],
                        **{c: pd.to_numeric(runs[c], errors="coerce") for c in COST_COLUMNS})
    grouped = frame.groupby(["backbone", "dataset", "row"], sort=False)
    out = pd.DataFrame({"mean": grouped["_value"].mean(), "std": grouped["_value"].std(),
                        "n": grouped["_value"].count(), "gain": grouped["_gain"].mean(),
                        **{c: grouped[c].mean() for c in COST_COLUMNS}})
    keys = out.index.to_frame(index=False).assign(
        rank=grouped["method"].first().map(registry.method_rank).to_numpy())
    out = out.iloc[keys.sort_values(["backbone", "dataset", "rank", "row"]).index]
    notes = [f"{METRICS[metric].label}: mean ± std over the finished runs with all their rows (n); Δ CLIP: the mean "
             "paired gain over zero-shot CLIP on the same samples and order",
             "latency: milliseconds per sample of the method alone, warm-up apart (in a pack, its share of its own "
             "method's pass); method memory: its peak above what was allocated when it began (the GPU allocator's; "
             "on a CPU the growth of the resident size, best effort), in a pack its share; means over the runs; — "
             "where not measured (runs written before these columns)"]
    title = f"Accuracy and cost by method{f' — sweep {sweep}' if sweep else ''}"
    return CostTable(title, out, notes, metric)
