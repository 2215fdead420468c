"""The SQL the views and compaction share (one definition each): per-run metrics, pairings against the baseline
method, stream curves and the pairings' statistics, and the column names compaction materialises; a leaf that
`db` (the views) and `store` (compaction) both import."""

from __future__ import annotations

import pyarrow as pa

from orchestrator.results import metrics


def sql_str(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def concat_runs(tables: list[pa.Table]) -> pa.Table | None:
    """One table from the runs rows; columns whose types differ between files (hand-made or extra hparams
    with mixed value types) become text rather than failing the whole view."""
    if not tables:
        return None
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        types: dict[str, set] = {}
        for t in tables:
            for f in t.schema:
                types.setdefault(f.name, set()).add(f.type)
        mixed = {name for name, ts in types.items() if len(ts) > 1}
        fixed = [t.cast(pa.schema([pa.field(f.name, pa.string()) if f.name in mixed else f for f in t.schema]))
                 for t in tables]
        return pa.concat_tables(fixed, promote_options="permissive")



def run_metrics_sql(samples: str, runs: str) -> str:
    """Per run, from its rows in `samples` (a relation with the samples view's columns) and its n_samples in
    `runs`: row counts and every metric of the registry (metrics.RUN_METRICS: definitions in numpy and SQL),
    stored as the trial stores them (x scale). The one definition: the accuracy view computes it over live rows,
    compaction materialises it per segment, `bca verify` recomputes it to compare."""
    m = metrics.run_metrics_sql(samples)
    return f"""
WITH expected AS (SELECT run_id, any_value(n_samples) AS n_samples FROM {runs} GROUP BY run_id),
p AS (
    -- one pass over the samples; e.n_samples is NULL when the run has no runs-table row
    SELECT s.run_id, any_value(s.sweep) AS s_sweep, any_value(s.backbone) AS s_backbone,
           any_value(s.dataset) AS s_dataset, any_value(s.method) AS s_method,
           count(*) AS n_rows, count(DISTINCT s.sample_idx) AS n_distinct,
           count(*) FILTER (WHERE s.is_ood) AS n_ood{m.aggregates}
    FROM {samples} s LEFT JOIN expected e USING (run_id)
    GROUP BY s.run_id
){m.ctes}
SELECT p.run_id, p.s_sweep, p.s_backbone, p.s_dataset, p.s_method, p.n_rows, p.n_distinct, p.n_ood, {m.values}
FROM p{m.joins}
"""


# What run_metrics_sql gives per run, besides run_id: materialised per segment under these names.
RUN_METRICS_COLUMNS = ("s_sweep", "s_backbone", "s_dataset", "s_method", "n_rows", "n_distinct", "n_ood",
                       *(m.name for m in metrics.RUN_METRICS))


# Each run against zero-shot CLIP on the very same samples in the very same order: the baseline run of the same
# setting (backbone, data, templates, views, stream), seed and order; several such runs (other sweeps): the first.
def baseline_pairs_sql(runs: str, baseline: str, among: str | None = None) -> str:
    """(run_id, baseline_run) of each run of `among` (default `runs`) that is not the baseline method, its baseline
    chosen among `runs`."""
    return f"""
WITH baseline AS (
    SELECT setting_id, seed, coalesce(order_index, 0) AS order_index, min(run_id) AS baseline_run
    FROM {runs} WHERE method = {baseline} GROUP BY ALL
)
SELECT r.run_id, b.baseline_run FROM {among or runs} r
JOIN baseline b ON r.setting_id = b.setting_id AND r.seed = b.seed AND coalesce(r.order_index, 0) = b.order_index
WHERE r.method <> {baseline}"""


def paired_rows_sql(pairs: str, samples: str, baseline_samples: str) -> str:
    """Helped / hurt / ... of each (run_id, baseline_run) in `pairs`, from the run's rows in `samples` and the
    baseline's in `baseline_samples` (the one definition: the paired view's and compaction's)."""
    return f"""
SELECT p.run_id, p.baseline_run,
       count(*) FILTER (WHERE s.correct AND NOT c.correct) AS helped,
       count(*) FILTER (WHERE c.correct AND NOT s.correct) AS hurt,
       count(*) FILTER (WHERE s.correct AND c.correct) AS both_right,
       count(*) FILTER (WHERE NOT s.correct AND NOT c.correct) AS both_wrong,
       count(*) FILTER (WHERE s.image_id <> c.image_id) AS misaligned
FROM {pairs} p
JOIN {samples} s ON s.run_id = p.run_id
JOIN {baseline_samples} c ON c.run_id = p.baseline_run AND c.sample_idx = s.sample_idx
WHERE NOT coalesce(s.is_ood, false)
GROUP BY ALL"""


PAIRED_COLUMNS = ("baseline_run", "helped", "hurt", "both_right", "both_wrong", "misaligned")

# A run's stream curve: accuracy per window of stream positions, about CURVE_POINTS windows over the run.
CURVE_POINTS = 25


def curve_window(rows: int) -> int:
    """The window giving about CURVE_POINTS points over `rows` stream positions (the dashboard's default, and the
    window compaction materialises each run's curve at)."""
    return max(1, -(-int(rows) // CURVE_POINTS))


def window_counts_sql(samples: str, window: str) -> str:
    """(run_id, win, n, k) of each run in `samples`: rows and correct predictions per window of `window` stream
    positions (a SQL expression, per run or constant). The one definition of a curve's counts."""
    return f"""
SELECT s.run_id, s.sample_idx // {window} AS win, count(*) AS n, sum(s.correct::INTEGER)::BIGINT AS k
FROM {samples} s GROUP BY ALL"""


def curve_points_sql(counts: str) -> str:
    """Cumulative and windowed accuracy (in %) at each window's end of `counts` (window_counts_sql's columns)."""
    return f"""
SELECT run_id, win,
       sum(n) OVER w AS position,
       100.0 * sum(k) OVER w / sum(n) OVER w AS cumulative,
       100.0 * k / n AS windowed
FROM ({counts})
WINDOW w AS (PARTITION BY run_id ORDER BY win ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
ORDER BY run_id, win"""


def run_curves_sql(samples: str) -> str:
    """Per run of `samples`: its curve's counts at curve_window(its rows), as lists by window (materialised by
    compaction; recomputed by `bca verify`)."""
    return f"""
WITH w AS (SELECT run_id, greatest(1, ceil(count(*) / {CURVE_POINTS}))::BIGINT AS curve_window
           FROM {samples} GROUP BY run_id),
c AS ({window_counts_sql(f"(SELECT s.*, w.curve_window FROM {samples} s JOIN w USING (run_id))", "s.curve_window")})
SELECT run_id, any_value(w.curve_window) AS curve_window, list(win ORDER BY win) AS curve_win,
       list(n ORDER BY win) AS curve_n, list(k ORDER BY win) AS curve_k
FROM c JOIN w USING (run_id) GROUP BY run_id"""


CURVE_COLUMNS = ("curve_window", "curve_win", "curve_n", "curve_k")
# A pairing's statistics as the paired view shows them, stored by compaction with the pairing's counts: a
# bootstrap per run (10^4 multinomial draws) at every query is minutes over a study's 10^5 runs
# (benchmarks/logs/scale-2026-11-27.txt).
PAIRED_STAT_COLUMNS = ("gain_ci_low", "gain_ci_high", "p_mcnemar")
# What compaction materialises besides the curve and the pairing's statistics, and a segment's whole metrics file
# (run_id, the per-run metrics, the run's pairing against its baseline, its curve, the pairing's statistics). A
# segment written before the curves (or a metric of the registry) existed gets them on the next `compact`
# (compaction.compact); until then its runs' curves (and metrics) are read from their rows. One written before the
# statistics were stored has them computed by the view.
MATERIALISED_METRICS = (*RUN_METRICS_COLUMNS, *PAIRED_COLUMNS)
SEGMENT_METRICS_COLUMNS = (*MATERIALISED_METRICS, *CURVE_COLUMNS, *PAIRED_STAT_COLUMNS)


def paired_statistics_sql(counts: str, baseline: str, stored: bool = False) -> str:
    """The paired counts of `counts` (paired_rows_sql's columns) with n and the statistics of
    orchestrator.results.stats (DuckDB functions bca_*), in points like accuracy; NULL when the two runs' rows
    are not the same images (misaligned > 0): no number at all rather than a wrong one. stored: `counts` also has
    PAIRED_STAT_COLUMNS, as compaction stored them (NULL where it did not: those are computed here)."""
    def stat(column: str, computed: str) -> str:
        value = f"coalesce({column}, {computed})" if stored else computed
        return f"CASE WHEN misaligned = 0 THEN {value} END AS {column}"

    return f"""
SELECT run_id, baseline_run, {baseline} AS baseline, helped, hurt, both_right, both_wrong, misaligned, n,
       CASE WHEN misaligned = 0 THEN 100 * (helped - hurt) / n END AS gain,
       {stat("gain_ci_low", "100 * bca_gain_ci_low(helped, hurt, n)")},
       {stat("gain_ci_high", "100 * bca_gain_ci_high(helped, hurt, n)")},
       {stat("p_mcnemar", "bca_mcnemar_p(helped, hurt)")}
FROM (SELECT *, helped + hurt + both_right + both_wrong AS n FROM ({counts}))"""
