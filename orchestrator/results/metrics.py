"""Per-run metrics from the stored per-sample rows, and their summary across stream orders (numpy; no torch).

Every metric is a function of arrays in stream order, so it can be recomputed from the results at any
time. The registry at the end of this module (RUN_METRICS) is the one place a metric is declared: name,
title, unit, direction, numpy definition and SQL definition; the trial, the views, the schema docs, the report
and the dashboard read it (tests check SQL == numpy for every entry). Accuracy-type metrics (top-1, top-5, ECE,
NLL, last-half and windowed accuracy, macro-F1, balanced accuracy) are over in-distribution samples only: a caller
passes those rows (``run_metrics`` filters them by ``is_ood``). An OOD sample (label -1) is thus neither a class
of macro-F1 or balanced accuracy nor a false positive of the class it was predicted as: it enters the OOD AUROC
only, as it enters no other metric but that.

Definitions:
- top-1: mean of ``correct``; top-5: mean of "the label is among the stored top-5 classes" (the top-min(5, K)
  classes of the posterior, best first).
- ECE: 15 equal-width confidence bins over [0, 1], bin b = (b/15, (b+1)/15] with a confidence of exactly 0
  in the first bin; ECE = sum_b |B_b|/n * |acc(B_b) - conf(B_b)| = sum_b |sum_{B_b}(correct - confidence)| / n.
  ``confidence`` is the max posterior.
- ECE20: the same with 20 bins, as TTA-VLM and TTABC report it.
- Macro-F1 (sklearn's ``f1_score(average='macro')``): over the classes that occur as a label or a prediction,
  F1_c = 2 TP_c / (2 TP_c + FP_c + FN_c), then the plain mean over those classes (L-TTA's long-tail measure).
- Balanced accuracy (sklearn's ``balanced_accuracy_score``): the mean over the classes that occur as a label of
  that class's recall, TP_c / (TP_c + FN_c).
- NLL: mean of -ln p(true class), the posterior probability of the true class stored per sample
  (``prob_true``), floored at the smallest positive normal float32 (1.1754944e-38) so that a probability
  that underflowed to 0 in float32 counts as 87.3 nats instead of infinity.
- Last-half accuracy: over positions >= n // 2 (the last n - n // 2 samples). Windowed accuracy: over
  consecutive windows of ``window`` samples from the start, the last window possibly shorter.
- Helped / hurt against zero-shot CLIP on the same stream: at each position (same image id required),
  helped = the method right and CLIP wrong, hurt = the method wrong and CLIP right.
- OOD AUROC of the confidence: in-distribution samples are positives; the probability that a random
  in-distribution sample is more confident than a random OOD one, ties counting one half.
- Across orders (OGA): mean, sample standard deviation (ddof = 1; undefined, NaN, for one order), and the
  mean of the worst 10% of orders: the k = max(1, ceil(N / 10)) lowest values, so N = 20 -> 2, 25 -> 3, 5 -> 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from orchestrator.stages import STAGE_COLUMNS

ECE_BINS = 15
ECE20_BINS = 20
TOP_K = 5
PROB_FLOOR = float(np.finfo(np.float32).tiny)  # smallest positive normal float32
_CONF_SLACK = 1e-5  # float32 posteriors may exceed 1 by a rounding step


def _array(values: Any, name: str, dtype: Any) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"metric input {name} must be 1-D, got shape {arr.shape}")
    return arr.astype(dtype)


def _nonempty(n: int, metric: str) -> None:
    if n == 0:
        raise ValueError(f"{metric} needs at least one sample, got none")


def top1(correct: Any) -> float:
    correct = _array(correct, "correct", bool)
    _nonempty(len(correct), "top-1 accuracy")
    return float(correct.mean())


def top5(top5_classes: Any, labels: Any) -> float:
    """``top5_classes``: [n, k<=5] class ids per sample (best first); ``labels``: [n] true classes."""
    classes = np.asarray(top5_classes)
    labels = _array(labels, "labels", np.int64)
    if classes.ndim != 2 or classes.shape[0] != len(labels) or not 1 <= classes.shape[1] <= TOP_K:
        raise ValueError(f"top5 classes must be [n, k] with n = {len(labels)} labels and 1 <= k <= {TOP_K}, "
                         f"got shape {classes.shape}")
    _nonempty(len(labels), "top-5 accuracy")
    return float((classes == labels[:, None]).any(axis=1).mean())


def _confidence(confidence: Any) -> np.ndarray:
    conf = _array(confidence, "confidence", np.float64)
    if not (np.isfinite(conf).all() and (conf >= 0).all() and (conf <= 1 + _CONF_SLACK).all()):
        bad = conf[~(np.isfinite(conf) & (conf >= 0) & (conf <= 1 + _CONF_SLACK))][0]
        raise ValueError(f"confidence must lie in [0, 1], got {float(bad)!r}")
    return conf


def ece_bin(confidence: np.ndarray, bins: int = ECE_BINS) -> np.ndarray:
    """Bin of each confidence: b with b/bins < c <= (b+1)/bins; 0 goes to bin 0, above 1 to the last bin."""
    return np.clip(np.ceil(confidence * bins).astype(np.int64) - 1, 0, bins - 1)


def ece(confidence: Any, correct: Any, bins: int = ECE_BINS) -> float:
    conf = _confidence(confidence)
    correct = _array(correct, "correct", np.float64)
    if len(correct) != len(conf):
        raise ValueError(f"ece needs as many correct flags as confidences, got {len(correct)} and {len(conf)}")
    _nonempty(len(conf), "ECE")
    gap = np.bincount(ece_bin(conf, bins), weights=correct - conf, minlength=bins)
    return float(np.abs(gap).sum() / len(conf))


def _labels_preds(labels: Any, preds: Any, metric: str) -> tuple[np.ndarray, np.ndarray]:
    labels, preds = _array(labels, "labels", np.int64), _array(preds, "preds", np.int64)
    if len(labels) != len(preds):
        raise ValueError(f"{metric} needs one prediction per label, got {len(preds)} and {len(labels)}")
    _nonempty(len(labels), metric)
    return labels, preds


def macro_f1(labels: Any, preds: Any) -> float:
    """Mean F1 over the classes that occur as a label or a prediction."""
    labels, preds = _labels_preds(labels, preds, "macro-F1")
    classes, at = np.unique(np.concatenate([labels, preds]), return_inverse=True)
    truth, guess = at[:len(labels)], at[len(labels):]
    tp = np.bincount(truth[labels == preds], minlength=len(classes))
    # 2 TP + FP + FN = (TP + FN) + (TP + FP): how often the class is the label plus how often it is predicted
    support = np.bincount(truth, minlength=len(classes)) + np.bincount(guess, minlength=len(classes))
    return float((2 * tp / support).mean())


def balanced_accuracy(labels: Any, preds: Any) -> float:
    """Mean recall over the classes that occur as a label."""
    labels, preds = _labels_preds(labels, preds, "balanced accuracy")
    classes, truth = np.unique(labels, return_inverse=True)
    hits = np.bincount(truth, weights=(labels == preds).astype(np.float64), minlength=len(classes))
    return float((hits / np.bincount(truth, minlength=len(classes))).mean())


def nll(prob_true: Any) -> float:
    p = _array(prob_true, "prob_true", np.float64)
    _nonempty(len(p), "NLL")
    if not (np.isfinite(p).all() and (p >= 0).all() and (p <= 1 + _CONF_SLACK).all()):
        raise ValueError("prob_true must lie in [0, 1] (the posterior probability of the true class)")
    return float(-np.log(np.maximum(p, PROB_FLOOR)).mean())


def last_half_accuracy(correct: Any) -> float:
    correct = _array(correct, "correct", bool)
    _nonempty(len(correct), "last-half accuracy")
    return float(correct[len(correct) // 2:].mean())


def windowed_accuracy(correct: Any, window: int) -> np.ndarray:
    """Accuracy per consecutive window of ``window`` samples (the last one may be shorter)."""
    correct = _array(correct, "correct", np.float64)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"accuracy window must be an integer >= 1, got {window!r}")
    _nonempty(len(correct), "windowed accuracy")
    starts = np.arange(0, len(correct), window)
    return np.add.reduceat(correct, starts) / np.diff(np.append(starts, len(correct)))


@dataclass(frozen=True)
class HelpedHurt:
    helped: int  # method right, zero-shot CLIP wrong
    hurt: int    # method wrong, zero-shot CLIP right


def helped_hurt(image_ids: Sequence[str], correct: Any, clip_image_ids: Sequence[str], clip_correct: Any
                ) -> HelpedHurt:
    """Counts against zero-shot CLIP over the very same stream: same image id at every position."""
    correct = _array(correct, "correct", bool)
    clip_correct = _array(clip_correct, "clip correct", bool)
    ids, clip_ids = np.asarray(image_ids, dtype=object), np.asarray(clip_image_ids, dtype=object)
    if not (len(ids) == len(correct) == len(clip_ids) == len(clip_correct)):
        raise ValueError(f"helped/hurt needs equal lengths, got {len(ids)} ids and {len(correct)} flags for the "
                         f"method, {len(clip_ids)} ids and {len(clip_correct)} flags for CLIP")
    mismatch = np.flatnonzero(ids != clip_ids)
    if mismatch.size:
        i = int(mismatch[0])
        raise ValueError(f"helped/hurt needs the same stream: position {i} is {ids[i]!r} for the method "
                         f"but {clip_ids[i]!r} for CLIP")
    return HelpedHurt(helped=int((correct & ~clip_correct).sum()), hurt=int((~correct & clip_correct).sum()))


def ood_auroc(confidence: Any, is_ood: Any) -> float:
    """AUROC of the confidence separating in-distribution (positive) from OOD samples; ties count 1/2."""
    conf = _confidence(confidence)
    ood = _array(is_ood, "is_ood", bool)
    if len(ood) != len(conf):
        raise ValueError(f"ood auroc needs one is_ood flag per confidence, got {len(ood)} and {len(conf)}")
    n_pos, n_neg = int((~ood).sum()), int(ood.sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"ood auroc needs both in-distribution and OOD samples, got {n_pos} and {n_neg}")
    # Mann-Whitney U from midranks: (rank sum of the positives - n_pos (n_pos + 1) / 2) / (n_pos n_neg).
    order = np.argsort(conf, kind="stable")
    ranks = np.empty(len(conf))
    sorted_conf = conf[order]
    first = np.r_[0, np.flatnonzero(np.diff(sorted_conf)) + 1]
    last = np.r_[first[1:], len(conf)]
    ranks[order] = np.repeat((first + last + 1) / 2.0, last - first)
    return float((ranks[~ood].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@dataclass(frozen=True)
class OrderSummary:
    mean: float
    std: float        # sample std (ddof 1); NaN for one order
    worst10: float    # mean of the worst_count lowest values
    worst_count: int  # max(1, ceil(N / 10))
    orders: int


def worst_count(n: int) -> int:
    """How many orders are the worst 10% of n: ceil(n / 10), at least 1."""
    return max(1, -(-n // 10))


def across_orders(values: Any) -> OrderSummary:
    """Summary of one metric over N stream orders of the same configuration (OGA's mean and worst 10%)."""
    v = _array(values, "values", np.float64)
    _nonempty(len(v), "the summary across orders")
    if not np.isfinite(v).all():
        raise ValueError("the summary across orders needs finite values")
    k = worst_count(len(v))
    std = float(v.std(ddof=1)) if len(v) > 1 else float("nan")
    return OrderSummary(mean=float(v.mean()), std=std, worst10=float(np.sort(v)[:k].mean()), worst_count=k,
                        orders=len(v))


@dataclass(frozen=True)
class RunMetrics:
    top1: float
    top5: float | None
    ece: float
    nll: float | None
    last_half: float
    helped_hurt: HelpedHurt | None
    ood_auroc: float | None
    ece20: float
    macro_f1: float | None
    balanced_accuracy: float | None


def run_metrics(*, correct: Any, confidence: Any, labels: Any, top5_classes: Any = None, prob_true: Any = None,
                is_ood: Any = None, image_ids: Sequence[str] | None = None,
                clip: tuple[Sequence[str], Any] | None = None, preds: Any = None) -> RunMetrics:
    """Every per-run metric from one run's rows in stream order; OOD rows only enter the AUROC.

    ``clip``: (image ids, correct) of zero-shot CLIP on the same stream, for helped / hurt (with the run's
    own ``image_ids``); metrics whose inputs are not given are None.
    """
    correct = _array(correct, "correct", bool)
    conf = _confidence(confidence)
    inside = ~_array(is_ood, "is_ood", bool) if is_ood is not None else np.ones(len(correct), bool)
    if not (len(conf) == len(correct) == len(inside)):
        raise ValueError("run metrics need one correct flag, confidence and is_ood flag per row")
    counts = None
    if clip is not None:
        if image_ids is None:
            raise ValueError("helped/hurt needs the run's image_ids as well as CLIP's")
        ids = np.asarray(image_ids, dtype=object)
        counts = helped_hurt(ids[inside], correct[inside], clip[0], clip[1])
    return RunMetrics(
        top1=top1(correct[inside]),
        top5=top5(np.asarray(top5_classes)[inside], np.asarray(labels)[inside]) if top5_classes is not None else None,
        ece=ece(conf[inside], correct[inside]),
        nll=nll(np.asarray(prob_true)[inside]) if prob_true is not None else None,
        # the last half of the stream's positions (as the views count it), its in-distribution rows
        last_half=top1(correct[len(correct) // 2:][inside[len(correct) // 2:]]),
        helped_hurt=counts,
        ood_auroc=ood_auroc(conf, ~inside) if not inside.all() else None,
        ece20=ece(conf[inside], correct[inside], ECE20_BINS),
        macro_f1=macro_f1(np.asarray(labels)[inside], np.asarray(preds)[inside]) if preds is not None else None,
        balanced_accuracy=(balanced_accuracy(np.asarray(labels)[inside], np.asarray(preds)[inside])
                           if preds is not None else None),
    )


# --------------------------------------------------------------------------------------------------- SQL
# The same metrics as DuckDB SQL over a relation (a table, view or parenthesised subquery) with the sample
# columns confidence FLOAT, correct BOOLEAN, prob_true FLOAT, label INTEGER, top5 INTEGER[], is_ood BOOLEAN,
# grouped by `keys` (e.g. "run_id"). Pass in-distribution rows for the accuracy-type metrics, e.g.
# in_distribution("samples").

def in_distribution(relation: str) -> str:
    return f"(SELECT * FROM {relation} WHERE NOT is_ood)"


def ece_sql(relation: str, keys: str = "run_id", bins: int = ECE_BINS) -> str:
    return f"""
SELECT {keys}, sum(abs(gap)) / sum(cnt) AS ece FROM (
    SELECT {keys}, least(greatest(ceil(confidence::DOUBLE * {bins}) - 1, 0), {bins - 1}) AS b,
           count(*) AS cnt, sum(correct::DOUBLE - confidence::DOUBLE) AS gap
    FROM {relation} GROUP BY {keys}, b
) GROUP BY {keys}"""


def macro_f1_sql(relation: str, keys: str = "run_id") -> str:
    """Macro-F1 per ``keys`` over the classes that occur as a label or a prediction (2 TP + FP + FN = label count +
    prediction count)."""
    return f"""
SELECT {keys}, avg(2.0 * tp / support) AS macro_f1 FROM (
    SELECT {keys}, c, sum(tp) AS tp, count(*) AS support FROM (
        SELECT {keys}, label AS c, (pred = label)::INTEGER AS tp FROM {relation}
        UNION ALL SELECT {keys}, pred AS c, 0 AS tp FROM {relation}
    ) GROUP BY {keys}, c
) GROUP BY {keys}"""


def balanced_accuracy_sql(relation: str, keys: str = "run_id") -> str:
    """Balanced accuracy per ``keys``: the mean over the classes that occur as a label of their recall."""
    return f"""
SELECT {keys}, avg(recall) AS balanced_accuracy FROM (
    SELECT {keys}, label, avg((pred = label)::DOUBLE) AS recall FROM {relation} GROUP BY {keys}, label
) GROUP BY {keys}"""


def auroc_sql(relation: str, keys: str = "run_id") -> str:
    """OOD AUROC of the confidence (in-distribution positive, midranks for ties) per ``keys`` that have both kinds."""
    return f"""
SELECT {keys}, (sum(midrank) FILTER (WHERE NOT is_ood) - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg) AS ood_auroc
FROM (
    SELECT {keys}, is_ood,
           rank() OVER (PARTITION BY {keys} ORDER BY confidence)
               + (count(*) OVER (PARTITION BY {keys}, confidence) - 1) / 2.0 AS midrank,
           count(*) FILTER (WHERE NOT is_ood) OVER (PARTITION BY {keys}) AS n_pos,
           count(*) FILTER (WHERE is_ood) OVER (PARTITION BY {keys}) AS n_neg
    FROM {relation}
) GROUP BY {keys}, n_pos, n_neg HAVING n_pos > 0 AND n_neg > 0"""


def across_orders_sql(relation: str, keys: str, value: str) -> str:
    """Mean, std (ddof 1), worst-10% mean and its count of column ``value`` per ``keys`` (one row per order)."""
    return f"""
SELECT {keys}, avg(v) AS mean, stddev_samp(v) AS std,
       avg(v) FILTER (WHERE rk <= greatest(1, (n + 9) // 10)) AS worst10,
       greatest(1, (any_value(n) + 9) // 10) AS worst_count, any_value(n) AS orders
FROM (
    SELECT {keys}, {value}::DOUBLE AS v,
           row_number() OVER (PARTITION BY {keys} ORDER BY {value}) AS rk,
           count(*) OVER (PARTITION BY {keys}) AS n
    FROM {relation}
) GROUP BY {keys}"""


# ------------------------------------------------------------------------------------- the registry
# One entry per metric: what the trial stores, the views compute, the schema documents and the report and the
# dashboard title and rank by. A stored value is `scale` x the definition (percent for fractions).

@dataclass(frozen=True)
class Metric:
    name: str               # the column of the runs and accuracy views
    title: str              # for tables, charts and the schema docs
    unit: str               # "%", "nats", "samples", "samples/s", ...
    higher_is_better: bool
    scale: float = 1.0
    # numpy: the definition's value from a run's RunMetrics (None when the run lacks its inputs)
    numpy: Any = None
    # SQL over one run's sample rows `s` (with e.n_samples, the run's stream length), grouped by run_id: an
    # aggregate expression computed in the accuracy view's single pass over the samples ...
    sql_aggregate: str | None = None
    # ... or, for metrics that need their own grouping, a function of a samples relation giving (run_id, value)
    sql_query: Any = None
    note: str = ""          # what the title leaves out, for the schema docs
    summary: str = ""       # the summary view's <summary>_mean / <summary>_std column prefix (default: the name)

    @property
    def percent(self) -> bool:
        return self.unit == "%"

    @property
    def label(self) -> str:
        """Title and unit, e.g. 'top-1 accuracy (%)': table titles, chart axes, the schema docs."""
        return f"{self.title} ({self.unit})" if self.unit else self.title

    @property
    def doc(self) -> str:
        return f"{self.label}: {self.note}" if self.note else self.label

    @property
    def summary_columns(self) -> tuple[str, str]:
        """The summary view's mean and std columns over a configuration's runs: accuracy's are plain `mean` and
        `std`, the table's headline; every other metric's `<summary>_mean` and `<summary>_std`."""
        if self.name == "accuracy":
            return "mean", "std"
        key = self.summary or self.name
        return f"{key}_mean", f"{key}_std"

    def stored(self, measured: RunMetrics) -> float | None:
        value = self.numpy(measured)
        return None if value is None else self.scale * value


_INSIDE = "NOT coalesce(s.is_ood, false)"


def _in_distribution(samples: str) -> str:
    return f"(SELECT * FROM {samples} s WHERE {_INSIDE})"


def _with_ood(samples: str) -> str:
    return f"(SELECT * FROM {samples} WHERE run_id IN (SELECT run_id FROM {samples} WHERE is_ood))"

RUN_METRICS: tuple[Metric, ...] = (
    Metric("accuracy", "top-1 accuracy", "%", True, 100.0, lambda m: m.top1,
           sql_aggregate=f"avg(s.correct::DOUBLE) FILTER (WHERE {_INSIDE})"),
    # the last half of the stream = positions i >= n // 2 (numpy's correct[n // 2:]), n the run's n_samples
    Metric("last50_accuracy", "accuracy over the last 50% of the stream", "%", True, 100.0, lambda m: m.last_half,
           sql_aggregate=f"avg(s.correct::DOUBLE) FILTER (WHERE s.sample_idx >= e.n_samples // 2 AND {_INSIDE})",
           summary="last50"),
    Metric("top5_accuracy", "top-5 accuracy", "%", True, 100.0, lambda m: m.top5,
           sql_aggregate="avg(list_contains(s.top5, s.label)::DOUBLE) "
                         f"FILTER (WHERE s.top5 IS NOT NULL AND {_INSIDE})", summary="top5"),
    Metric("ece", "expected calibration error", "%", False, 100.0, lambda m: m.ece,
           sql_query=lambda samples: f"SELECT run_id, ece AS value FROM ({ece_sql(_in_distribution(samples))})",
           note=f"{ECE_BINS} equal-width confidence bins"),
    Metric("nll", "negative log-likelihood", "nats", False, 1.0, lambda m: m.nll,
           sql_aggregate=f"avg(-ln(greatest(s.prob_true::DOUBLE, {PROB_FLOOR!r}))) "
                         f"FILTER (WHERE s.prob_true IS NOT NULL AND {_INSIDE})",
           note="mean negative log posterior of the true class"),
    Metric("ood_auroc", "OOD AUROC", "%", True, 100.0, lambda m: m.ood_auroc,
           sql_query=lambda samples: f"SELECT run_id, ood_auroc AS value FROM ({auroc_sql(_with_ood(samples))})",
           note="of the confidence, separating in- from out-of-distribution samples"),
    # after ood_auroc: the runs table's columns keep the order older files have (schema.METRIC_COLUMNS)
    Metric("ece20", "expected calibration error (20 bins)", "%", False, 100.0, lambda m: m.ece20,
           sql_query=lambda samples: (f"SELECT run_id, ece AS value FROM "
                                      f"({ece_sql(_in_distribution(samples), bins=ECE20_BINS)})"),
           note=f"{ECE20_BINS} equal-width confidence bins, as TTA-VLM and TTABC report it"),
    Metric("macro_f1", "macro-F1", "%", True, 100.0, lambda m: m.macro_f1,
           sql_query=lambda samples: (f"SELECT run_id, macro_f1 AS value FROM "
                                      f"({macro_f1_sql(_in_distribution(samples))})"),
           note="mean F1 over the classes that occur as a label or a prediction"),
    Metric("balanced_accuracy", "balanced accuracy", "%", True, 100.0, lambda m: m.balanced_accuracy,
           sql_query=lambda samples: (f"SELECT run_id, balanced_accuracy AS value FROM "
                                      f"({balanced_accuracy_sql(_in_distribution(samples))})"),
           note="mean recall over the classes that occur as a label"),
)

# Against the baseline on the same samples in the same order (the paired view; orchestrator.results.stats).
PAIRED_METRICS: tuple[Metric, ...] = (
    Metric("helped", "samples right where CLIP is wrong (same samples, same order)", "samples", True),
    Metric("hurt", "samples wrong where CLIP is right (same samples, same order)", "samples", False),
    Metric("gain", "accuracy gain over CLIP on the same samples", "points", True),
    Metric("p_mcnemar", "exact McNemar p-value of the gain over CLIP", "p", False),
)

# Measured by the trial as it runs, not from the rows.
COST_METRICS: tuple[Metric, ...] = (
    Metric("samples_per_s", "throughput of the online loop", "samples/s", True),
    Metric("warmup_s", "warm-up", "s", False,
           note="the first call of the run's code in its process (compilation); not in the costs"),
    *(Metric(c, c.replace("_", " "), "", False) for c in STAGE_COLUMNS),
    Metric("peak_mem_mb", "peak memory", "MB", False),
    Metric("latency_ms", "latency per sample", "ms", False,
           note="the run's method alone (its share of its method's pass in a pack), warm-up apart"),
    Metric("method_mem_mb", "method memory", "MB", False,
           note="the method's own peak above what was allocated when it began (its share in a pack)"),
)

METRICS: dict[str, Metric] = {m.name: m for m in (*RUN_METRICS, *PAIRED_METRICS, *COST_METRICS)}


def metric(name: str) -> Metric:
    """The registered metric called `name`; a clear error naming the known ones otherwise."""
    try:
        return METRICS[name]
    except KeyError:
        raise ValueError(f"unknown metric {name!r}; expected one of: {', '.join(METRICS)}") from None


@dataclass(frozen=True)
class RunMetricsSQL:
    """The registry's per-run metrics as pieces of one query over `<samples> s LEFT JOIN <expected> e`, grouped by
    run_id, into a CTE named `p` (the caller adds its own bookkeeping to that single pass)."""

    aggregates: str  # ", <aggregate> AS <name>, ..." for p's select list
    ctes: str        # ", m_<name> AS (<query>), ..." to follow p in the WITH clause
    joins: str       # " LEFT JOIN m_<name> USING (run_id) ..." after FROM p
    values: str      # "<scale> * ... AS <name>, ...": the stored values


def run_metrics_sql(samples: str = "samples") -> RunMetricsSQL:
    """The pieces over the rows of `samples` (a relation with the samples view's columns)."""
    one_pass = [m for m in RUN_METRICS if m.sql_aggregate]
    own = [m for m in RUN_METRICS if not m.sql_aggregate]
    return RunMetricsSQL(
        aggregates="".join(f", {m.sql_aggregate} AS {m.name}" for m in one_pass),
        ctes="".join(f", m_{m.name} AS ({m.sql_query(samples)})" for m in own),
        joins="".join(f" LEFT JOIN m_{m.name} USING (run_id)" for m in own),
        values=", ".join(f"{m.scale!r} * " + (f"p.{m.name}" if m.sql_aggregate else f"m_{m.name}.value")
                         + f" AS {m.name}" for m in RUN_METRICS))


def stored_run_metrics(measured: RunMetrics) -> dict[str, float | None]:
    """The runs table's metric columns of one run, as the trial writes them."""
    return {m.name: m.stored(measured) for m in RUN_METRICS}
