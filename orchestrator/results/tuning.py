"""Honest tuning: each method's configuration chosen on some runs and reported on the others.

A sweep's grid (tau x n1 x n2, ...) measured on the test streams, then its best cell set in a paper table, is
tuned on the test set. `bca report --tune-on PREDICATE` splits the runs instead: the runs the predicate (SQL
over the runs view, e.g. "order_index < 50" or "seed = 1") matches are the tuning runs; per method, backbone (its
weights), starting point (a learned context), dataset and stream protocol, the configuration (group_id: one hparam
setting over its seeds and orders) with the best mean of the metric over its finished, complete tuning runs is
chosen (ties: the smaller group_id), and the tables stand on that configuration's other runs only. The SQL table macros `tuned_choice(tune_ids, metric)` (the
choice per cell) and `tuned(tune_ids, metric)` (the accuracy view's rows of the chosen configurations' other
runs) are the one definition; this module reads them. docs/statistics.md says what this does and does not
protect against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import duckdb
import pandas as pd
import pyarrow as pa

from orchestrator import registry
from orchestrator.results import evidence, metrics, safety
from orchestrator.results.labels import fmt_value, follows
from orchestrator.results.sql import sql_str

# Cells of a tuning: one choice per method on one backbone, dataset and stream protocol.
CELL = ("method", "backbone", "dataset", "stream")


def _value_sql(metric: str) -> str:
    """The column the SQL expression `metric` names (an unknown name: an error naming the known ones)."""
    cases = " ".join(f"WHEN {sql_str(m.name)} THEN {m.name}" for m in metrics.RUN_METRICS)
    known = ", ".join(m.name for m in metrics.RUN_METRICS)
    return f"CASE {metric} {cases} ELSE error('tuned: unknown metric ' || {metric} || '; expected one of: {known}') END"


def _sign_sql(metric: str) -> str:
    """+1 where higher is better for the metric `metric` names, -1 where lower is."""
    lower = ", ".join(sql_str(m.name) for m in metrics.RUN_METRICS if not m.higher_is_better)
    return f"CASE WHEN {metric} IN ({lower}) THEN -1 ELSE 1 END"


def tuned_choice_sql(tune_ids: str, metric: str) -> str:
    """Per cell, the configuration with the best mean `metric` over its finished, complete runs among `tune_ids`
    (SQL expressions: a list of run ids and a metric's name), with that mean, its runs and the candidates."""
    return f"""
WITH candidates AS (
    SELECT method, backbone, pretrained, weights_sha256, context_sha256, vis_means_sha256, vis_vars_sha256, dataset, stream, group_id,
           avg({_value_sql(metric)}) AS tune_mean, count(*) AS tune_runs
    FROM accuracy
    WHERE status = 'finished' AND complete AND group_id IS NOT NULL AND run_id IN (SELECT unnest({tune_ids}))
    GROUP BY ALL HAVING tune_mean IS NOT NULL
)
SELECT method, backbone, dataset, stream, group_id, {metric} AS tuned_metric, tune_mean, tune_runs, candidates
FROM (
    SELECT *, row_number() OVER (cell ORDER BY {_sign_sql(metric)} * tune_mean DESC, group_id) AS rk,
           count(*) OVER cell AS candidates
    FROM candidates
    -- a cell: one method on one backbone's weights from one starting point, one dataset and stream protocol
    WINDOW cell AS (PARTITION BY method, backbone, pretrained, weights_sha256, context_sha256, vis_means_sha256, vis_vars_sha256, dataset, stream)
) WHERE rk = 1"""


def tuned_sql(tune_ids: str, metric: str) -> str:
    """The accuracy view's rows of each chosen configuration's runs outside `tune_ids`, with the choice's
    tune_mean, tune_runs and candidates."""
    return f"""
SELECT a.*, c.tuned_metric, c.tune_mean, c.tune_runs, c.candidates
FROM accuracy a JOIN ({tuned_choice_sql(tune_ids, metric)}) c USING (group_id)
WHERE a.run_id NOT IN (SELECT unnest({tune_ids}))"""


MACROS = (
    "CREATE OR REPLACE MACRO tuned_choice(tune_ids, metric := 'accuracy') AS TABLE "
    + tuned_choice_sql("tune_ids", "metric"),
    "CREATE OR REPLACE MACRO tuned(tune_ids, metric := 'accuracy') AS TABLE " + tuned_sql("tune_ids", "metric"),
)


class TuneOnError(ValueError):
    """A --tune-on predicate that is not SQL over the runs view, or that leaves nothing to tune on or report."""


@dataclass(frozen=True)
class Tuning:
    """A tuning split: the predicate, the metric, the tuning runs and the choice per cell (tuned_choice's rows)."""

    predicate: str
    metric: str
    tune_ids: frozenset[str]
    choices: pd.DataFrame

    def evaluation(self, runs: pd.DataFrame) -> pd.DataFrame:
        """The runs a tuned table stands on: the chosen configurations' runs that are not tuning runs."""
        chosen = set(self.choices["group_id"])
        keep = runs["group_id"].isin(chosen) & ~runs["run_id"].isin(self.tune_ids)
        return runs[keep]

    def notes(self, runs: pd.DataFrame, hparams: Sequence[str]) -> list[str]:
        """The caption: what was tuned on what, and each cell's choice where there was one to make (at most
        evidence.MAX_LISTED, then a count)."""
        label = metrics.metric(self.metric).label
        evaluated = len(self.evaluation(runs))
        notes = [f"tuned on the {len(self.tune_ids)} run(s) where {self.predicate}: per method, backbone, dataset and "
                 f"stream, the configuration with the best mean {label} there; the cells stand on its other "
                 f"{evaluated} run(s) only"]
        lines = []
        for choice in self.choices.itertuples(index=False):
            if choice.candidates < 2:
                continue
            where = " · ".join([registry.method_label(choice.method), str(choice.backbone),
                                registry.dataset_title(choice.dataset)]
                               + ([fmt_value(choice.stream, "stream")] if isinstance(choice.stream, str) else []))
            lines.append(f"  {where}: {_config_text(runs, choice.group_id, choice.method, hparams)} (best of "
                         f"{choice.candidates} configurations, mean {choice.tune_mean:.2f} on {choice.tune_runs} "
                         "tuning run(s))")
        if lines:
            notes.append("chosen configurations:")
            notes.extend(lines[:evidence.MAX_LISTED] + ([f"  ... and {len(lines) - evidence.MAX_LISTED} more"]
                                                        if len(lines) > evidence.MAX_LISTED else []))
        return notes


def _config_text(runs: pd.DataFrame, group_id: str, method: str, hparams: Sequence[str]) -> str:
    """The chosen configuration's hparams that vary among the method's runs, e.g. 'tau=0.3, n1=100'."""
    own = runs[runs["method"] == method]
    first = own[own["group_id"] == group_id]
    if first.empty:
        return group_id
    vary = [h for h in hparams if h in own and own[h].nunique(dropna=False) > 1]
    vary = [h for h in vary if not follows(own, method, h, vary)]  # tau_prior = tau adds nothing
    row = first.iloc[0]
    return ", ".join(f"{h}={_plain(row[h])}" for h in vary) or group_id


def _plain(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    return f"{value:g}" if isinstance(value, float) else value


def tune(db: Any, predicate: str, metric: str = "accuracy") -> Tuning:
    """The tuning split of `predicate` (SQL over the runs view) on `metric`; TuneOnError with DuckDB's message
    for a predicate that is not valid SQL there, or one that matches no run or every run."""
    if metric not in metrics.METRICS or metrics.METRICS[metric] not in metrics.RUN_METRICS:
        raise TuneOnError(f"unknown metric {metric!r}; expected one of: "
                          f"{', '.join(m.name for m in metrics.RUN_METRICS)}")
    try:
        matched = db.query(f"SELECT run_id FROM runs WHERE ({predicate})")
    except (safety.QueryRefused, duckdb.Error) as e:
        raise TuneOnError(f"--tune-on {predicate!r} is not a predicate over the runs view: {e}") from None
    ids = frozenset(matched.column("run_id").to_pylist())
    total = db.sql("SELECT count(*) AS n FROM runs").column("n")[0].as_py()
    if not ids:
        raise TuneOnError(f"--tune-on {predicate!r} matches none of the {total} runs: nothing to tune on")
    if len(ids) == total:
        raise TuneOnError(f"--tune-on {predicate!r} matches every one of the {total} runs: nothing left to report "
                          "on")
    choices = db.df(f"SELECT * FROM tuned_choice((SELECT list(run_id) FROM tune_ids), {sql_str(metric)}) "
                    "ORDER BY method, backbone, dataset, stream",
                    tables={"tune_ids": pa.table({"run_id": pa.array(sorted(ids), pa.string())})})
    return Tuning(predicate, metric, ids, choices)
