import math

import duckdb
import numpy as np
import pyarrow as pa
import pytest

from orchestrator.results.metrics import (
    METRICS, RUN_METRICS, HelpedHurt, across_orders, across_orders_sql, balanced_accuracy, ece, last_half_accuracy,
    macro_f1, nll, ood_auroc, run_metrics, run_metrics_sql, stored_run_metrics, top1, top5, windowed_accuracy,
    worst_count,
)


def test_ece_by_hand():
    # Bins of width 1/15: 0.0 -> bin 0, 0.9 -> (13/15, 14/15], 0.95 and 1.0 -> (14/15, 1], 0.5 -> (7/15, 8/15].
    conf = [0.0, 0.9, 0.95, 1.0, 0.5, 0.5]
    correct = [False, True, False, True, True, False]
    # |gap| per bin: 0, |1 - 0.9| = 0.1, |(0 - 0.95) + (1 - 1)| = 0.95, |0.5 - 0.5| = 0 -> (0.1 + 0.95) / 6.
    assert ece(conf, correct) == pytest.approx(1.05 / 6, abs=1e-12)
    assert ece([1.0, 1.0], [True, True]) == 0.0
    assert ece([0.7], [False]) == pytest.approx(0.7)


def test_ece_is_the_standard_weighted_gap():
    rng = np.random.default_rng(0)
    conf = rng.uniform(0, 1, 500).astype(np.float32)
    correct = rng.uniform(0, 1, 500) < conf
    c64 = conf.astype(np.float64)
    expected = 0.0
    for b in range(15):
        lo, hi = b / 15, (b + 1) / 15
        member = (c64 > lo) & (c64 <= hi) if b else (c64 <= hi)
        if member.any():
            expected += member.mean() * abs(correct[member].mean() - c64[member].mean())
    assert ece(conf, correct) == pytest.approx(expected, abs=1e-12)


def test_nll_by_hand_with_the_float32_floor():
    # -ln 1, -ln 1/2, -ln 1/4, and 0 floored at 2**-126: (0 + 1 + 2 + 126) ln 2 / 4.
    assert nll([1.0, 0.5, 0.25, 0.0]) == pytest.approx(129 * math.log(2) / 4, rel=1e-12)


def test_top1_and_top5_by_hand():
    assert top1([True, False, True, True]) == 0.75
    labels = [5, 0, 4]
    classes = [[1, 2, 3, 4, 5], [9, 8, 7, 6, 1], [4, 0, 1, 2, 3]]
    assert top5(classes, labels) == pytest.approx(2 / 3)
    assert top5([[1, 0], [0, 1]], [0, 2]) == 0.5  # K = 2 classes: two stored per sample


def test_last_half_and_windows_by_hand():
    correct = [1, 0, 1, 1, 0, 0, 1]
    assert last_half_accuracy(correct) == 0.5  # positions 3..6: 1, 0, 0, 1
    assert np.allclose(windowed_accuracy(correct, 3), [2 / 3, 1 / 3, 1.0])
    assert np.allclose(windowed_accuracy(correct, 10), [4 / 7])


def test_ood_auroc_by_hand_with_ties():
    # ID 0.9, 0.6, 0.6 against OOD 0.6, 0.3: of 6 pairs, 4 won and 2 tied -> (4 + 2 / 2) / 6.
    conf = [0.9, 0.6, 0.6, 0.6, 0.3]
    is_ood = [False, False, False, True, True]
    assert ood_auroc(conf, is_ood) == pytest.approx(5 / 6)
    assert ood_auroc([0.1, 0.9], [False, True]) == 0.0
    assert ood_auroc([0.5, 0.5], [False, True]) == 0.5


def test_ood_auroc_matches_pairwise_counting():
    rng = np.random.default_rng(1)
    conf = np.round(rng.uniform(0, 1, 300), 2)  # rounding makes ties
    is_ood = rng.uniform(0, 1, 300) < 0.3
    pos, neg = conf[~is_ood][:, None], conf[is_ood][None, :]
    expected = ((pos > neg).sum() + 0.5 * (pos == neg).sum()) / (pos.size * neg.size)
    assert ood_auroc(conf, is_ood) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "k"), [(1, 1), (5, 1), (10, 1), (11, 2), (20, 2), (25, 3), (30, 3), (100, 10)])
def test_worst_count_is_ceil_of_a_tenth(n, k):
    assert worst_count(n) == k


def test_across_orders_by_hand():
    s = across_orders([1.0, 2.0, 3.0, 4.0])
    assert (s.mean, s.worst10, s.worst_count, s.orders) == (2.5, 1.0, 1, 4)
    assert s.std == pytest.approx(math.sqrt(5 / 3))
    values = [0.5, 0.7, 0.6, 0.9, 0.8, 0.4, 0.65, 0.75, 0.55, 0.85, 0.3]  # 11 orders: the worst 2
    s = across_orders(values)
    assert s.worst10 == pytest.approx(0.35) and s.mean == pytest.approx(7 / 11) and s.worst_count == 2
    assert math.isnan(across_orders([0.5]).std) and across_orders([0.5]).worst10 == 0.5


def test_run_metrics_leaves_ood_rows_out_of_accuracy():
    correct = np.array([True, False, True, False, True, False])
    conf = np.array([0.9, 0.4, 0.8, 0.2, 0.7, 0.1])
    is_ood = np.array([False, False, False, True, False, True])
    labels = np.array([1, 2, 0, -1, 1, -1])
    top = np.array([[1, 0], [0, 2], [0, 1], [0, 1], [0, 1], [0, 1]])
    prob_true = np.array([0.9, 0.25, 0.8, np.nan, 0.5, np.nan])
    ids = [f"img{i}" for i in range(6)]
    clip_ids = [i for i, o in zip(ids, is_ood) if not o]
    m = run_metrics(correct=correct, confidence=conf, labels=labels, top5_classes=top, prob_true=prob_true,
                    is_ood=is_ood, image_ids=ids, clip=(clip_ids, [False, False, True, False]))
    assert m.top1 == 0.75 and m.top5 == 1.0 and m.last_half == 1.0  # in-distribution: T, F | T, T
    assert m.nll == pytest.approx(-np.log([0.9, 0.25, 0.8, 0.5]).mean())
    assert m.ece == pytest.approx(ece([0.9, 0.4, 0.8, 0.7], [True, False, True, True]))
    assert m.helped_hurt == HelpedHurt(helped=2, hurt=0)
    assert m.ood_auroc == 1.0  # every OOD sample is less confident than every in-distribution one
    plain = run_metrics(correct=correct, confidence=conf, labels=labels)
    assert plain.top1 == 0.5 and plain.top5 is None and plain.ood_auroc is None and plain.helped_hurt is None


def test_helped_hurt_refuses_another_stream():
    with pytest.raises(ValueError, match="position 1 is 'b' for the method but 'c' for CLIP"):
        run_metrics(correct=[1, 0], confidence=[0.5, 0.5], labels=[0, 0], image_ids=["a", "b"],
                    clip=(["a", "c"], [1, 1]))


def test_ece20_is_the_plain_twenty_bin_gap():
    rng = np.random.default_rng(3)
    conf = rng.uniform(0, 1, 400)
    conf[:4] = [0.0, 0.05, 0.95, 1.0]  # bin edges: (0.9, 0.95] is bin 18, 0.05 is bin 0 with 0
    correct = rng.uniform(0, 1, 400) < conf
    expected = 0.0
    for b in range(20):
        inside = (conf > b / 20) & (conf <= (b + 1) / 20) if b else conf <= 1 / 20
        if inside.any():
            expected += inside.sum() / len(conf) * abs(correct[inside].mean() - conf[inside].mean())
    got = run_metrics(correct=correct, confidence=conf, labels=np.zeros(400, int)).ece20
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_macro_f1_and_balanced_accuracy_are_sklearns():
    from sklearn.metrics import balanced_accuracy_score, f1_score

    rng = np.random.default_rng(4)
    for k, n in ((2, 7), (10, 300), (50, 400)):  # at K = 50, n = 400 some classes occur only as a prediction
        labels = rng.integers(0, k, n)
        preds = np.where(rng.uniform(0, 1, n) < 0.6, labels, rng.integers(0, k, n))
        assert macro_f1(labels, preds) == pytest.approx(f1_score(labels, preds, average="macro"), rel=1e-12)
        assert balanced_accuracy(labels, preds) == pytest.approx(balanced_accuracy_score(labels, preds), rel=1e-12)


def test_ood_rows_are_no_class_of_macro_f1():
    # OOD rows (label -1) predicted as class 0 would be false positives of class 0: they are left out
    labels, preds = np.array([0, 0, 1, -1, -1]), np.array([0, 1, 1, 0, 0])
    m = run_metrics(correct=labels == preds, confidence=np.full(5, 0.5), labels=labels, preds=preds,
                    is_ood=labels < 0)
    assert m.macro_f1 == pytest.approx(macro_f1([0, 0, 1], [0, 1, 1])) == pytest.approx((2 / 3 + 2 / 3) / 2)
    assert m.balanced_accuracy == pytest.approx(0.75)


def _samples(seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    n = 900
    run = np.repeat(["r0", "r1", "r2"], n // 3)
    label = rng.integers(0, 8, n)
    top = np.stack([rng.permutation(8)[:5] for _ in range(n)])
    conf = rng.uniform(0, 1, n).astype(np.float32)
    conf[:5] = [0.0, 1.0, 0.5, np.float32(1 / 15), np.float32(14 / 15)]
    pred = np.where(rng.uniform(0, 1, n) < 0.5, label, rng.integers(0, 8, n))
    return pa.table({
        "run_id": run, "label": label.astype(np.int32), "pred": pred.astype(np.int32),
        "top5": pa.array(top.astype(np.int32).tolist(), pa.list_(pa.int32())),
        "confidence": conf, "correct": rng.uniform(0, 1, n) < conf,
        "prob_true": np.where(rng.uniform(0, 1, n) < 0.02, 0.0, rng.uniform(0, 1, n)).astype(np.float32),
        "is_ood": rng.uniform(0, 1, n) < 0.1,
    })


def _by_run(con, sql: str) -> dict[str, float]:
    return {row[0]: row[1] for row in con.execute(sql).fetchall()}


def test_every_registered_metric_is_the_same_in_sql_and_numpy():
    table = _samples()
    per_run = len(table) // 3
    table = table.append_column("sample_idx", pa.array(np.tile(np.arange(per_run), 3)))
    con = duckdb.connect()
    con.register("samples", table)
    con.execute(f"CREATE TABLE expected AS SELECT run_id, {per_run} AS n_samples FROM samples GROUP BY run_id")
    m = run_metrics_sql()
    sql = (f"WITH p AS (SELECT s.run_id{m.aggregates} FROM samples s LEFT JOIN expected e USING (run_id) "
           f"GROUP BY s.run_id){m.ctes} SELECT p.run_id, {m.values} FROM p{m.joins} ORDER BY p.run_id")
    got = con.execute(sql).df().set_index("run_id")
    d = table.to_pydict()
    for run in ("r0", "r1", "r2"):
        rows = [i for i, r in enumerate(d["run_id"]) if r == run]
        col = {k: table[k].to_numpy(zero_copy_only=False)[rows]
               for k in ("correct", "confidence", "label", "pred", "is_ood")}
        measured = run_metrics(correct=col["correct"], confidence=col["confidence"], labels=col["label"],
                               top5_classes=np.array(d["top5"], dtype=np.int64)[rows],
                               prob_true=table["prob_true"].to_numpy()[rows], is_ood=col["is_ood"], preds=col["pred"])
        for name, value in stored_run_metrics(measured).items():
            assert got.at[run, name] == pytest.approx(value, rel=1e-12, abs=1e-12), (run, name)
    assert list(got.columns) == [metric.name for metric in RUN_METRICS]


def test_registry_entries_are_complete():
    for metric in RUN_METRICS:
        assert metric.numpy is not None and (metric.sql_aggregate or metric.sql_query), metric.name
        assert metric.label.startswith(metric.title) and metric.unit in metric.label
    assert METRICS["ece"].higher_is_better is False and METRICS["accuracy"].label == "top-1 accuracy (%)"


def test_across_orders_sql_equals_numpy():
    rng = np.random.default_rng(2)
    sizes = {"bca": 11, "la": 20, "pa": 1, "clip": 25}
    rows = [(m, i, float(v)) for m, n in sizes.items() for i, v in enumerate(rng.uniform(0.4, 0.8, n))]
    con = duckdb.connect()
    con.execute("CREATE TABLE runs (method VARCHAR, order_idx INTEGER, acc DOUBLE)")
    con.executemany("INSERT INTO runs VALUES (?, ?, ?)", rows)
    out = {r[0]: r[1:] for r in con.execute(across_orders_sql("runs", "method", "acc")).fetchall()}
    for method in sizes:
        s = across_orders([v for m, _, v in rows if m == method])
        mean, std, worst, k, n = out[method]
        assert (k, n) == (s.worst_count, s.orders)
        assert mean == pytest.approx(s.mean) and worst == pytest.approx(s.worst10)
        assert (std is None) if n == 1 else std == pytest.approx(s.std)


@pytest.mark.parametrize(("call", "needle"), [
    (lambda: ece([1.5], [True]), r"confidence must lie in \[0, 1\], got 1.5"),
    (lambda: ece([0.5, 0.5], [True]), "ece needs as many correct flags as confidences, got 1 and 2"),
    (lambda: ece([], []), "ECE needs at least one sample"),
    (lambda: nll([1.2]), r"prob_true must lie in \[0, 1\]"),
    (lambda: top5([[1, 2, 3, 4, 5, 6]], [1]), r"top5 classes must be \[n, k\] with n = 1 labels and 1 <= k <= 5"),
    (lambda: windowed_accuracy([1, 0], 0), "accuracy window must be an integer >= 1, got 0"),
    (lambda: ood_auroc([0.5, 0.6], [False, False]), "needs both in-distribution and OOD samples, got 2 and 0"),
    (lambda: across_orders([]), "the summary across orders needs at least one sample"),
    (lambda: run_metrics(correct=[1], confidence=[0.5], labels=[0], clip=(["a"], [1])),
     "helped/hurt needs the run's image_ids"),
])
def test_bad_inputs(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()
