import numpy as np
import pytest
import torch

from orchestrator.data.streams import (
    HELD_OUT_CLASSES, Contaminated, Continual, Dirichlet, Iid, LongTail, Separate, derive_order_seeds, held_out_split,
    iid_permutation, protocol_from_spec, stream_for_batch,
)

# 20 classes of uneven sizes (10..48 samples), in dataset order grouped by nothing in particular.
LABELS = np.random.default_rng(0).permutation(np.repeat(np.arange(20), np.arange(10, 50, 2)))


def _runs(labels: np.ndarray) -> np.ndarray:
    """Lengths of the maximal runs of one class."""
    change = np.flatnonzero(labels[1:] != labels[:-1]) + 1
    return np.diff(np.concatenate([[0], change, [len(labels)]]))


def _is_permutation(index: np.ndarray, n: int) -> bool:
    return np.array_equal(np.sort(index), np.arange(n))


@pytest.mark.parametrize("n", [0, 1, 2, 7, 1000, 50000])
@pytest.mark.parametrize("seed", [0, 3, 2**31 + 11, 2**32 + 5])
def test_iid_is_the_trials_torch_permutation(n, seed):
    assert np.array_equal(iid_permutation(n, seed), torch.randperm(n, generator=torch.Generator().manual_seed(seed)).numpy())


def test_iid_protocol_order_is_the_permutation_with_no_flags():
    order = Iid().order(LABELS, 4)
    assert np.array_equal(order.index, torch.randperm(len(LABELS), generator=torch.Generator().manual_seed(4)).numpy())
    assert not order.source.any() and not order.is_ood.any() and len(order) == len(LABELS)


@pytest.mark.parametrize("protocol", [Iid(), Dirichlet(0.1), Dirichlet(0.001, slots=5), Separate()])
def test_single_dataset_orders_are_deterministic_permutations(protocol):
    a, b, c = protocol.order(LABELS, 1), protocol.order(LABELS, 1), protocol.order(LABELS, 2)
    assert _is_permutation(a.index, len(LABELS))
    assert np.array_equal(a.index, b.index) and not np.array_equal(a.index, c.index)


def test_separate_is_one_run_per_class_in_a_seeded_class_order():
    orders = [LABELS[Separate().order(LABELS, s).index] for s in range(5)]
    for labels in orders:
        assert len(_runs(labels)) == 20
        assert np.array_equal(np.bincount(labels), np.bincount(LABELS))
    first_classes = {tuple(labels[np.r_[0, np.flatnonzero(np.diff(labels)) + 1]]) for labels in orders}
    assert len(first_classes) == 5  # the class order itself is random


def test_separate_shuffles_within_a_class():
    index = Separate().order(LABELS, 0).index
    members = index[LABELS[index] == LABELS[index[0]]]
    assert not np.array_equal(members, np.sort(members))


def _mean_run(gamma: float, seeds=range(8)) -> float:
    return float(np.mean([_runs(LABELS[Dirichlet(gamma).order(LABELS, s).index]).mean() for s in seeds]))


def test_dirichlet_smaller_gamma_gives_longer_runs():
    iid = np.mean([_runs(LABELS[Iid().order(LABELS, s).index]).mean() for s in range(8)])
    runs = [_mean_run(g) for g in (10.0, 0.1, 0.01, 0.001)]
    assert iid < 1.1 and abs(runs[0] - iid) < 0.1  # large gamma spreads each class evenly: i.i.d.-like
    assert runs[0] < runs[1] < runs[2] < runs[3]
    # gamma 0.001: each class falls into one slot, shared with about one other class on average (20 classes
    # into 20 slots), so a class spans about 2/20 of the stream; in an i.i.d. order it spans nearly all of it.
    assert _mean_span(Dirichlet(0.001)) < 0.2 and _mean_span(Iid()) > 0.9


def _mean_span(protocol) -> float:
    """Mean over classes and seeds of (last - first + 1) / n of the class's stream positions."""
    spans = []
    for seed in range(8):
        labels = LABELS[protocol.order(LABELS, seed).index]
        for c in range(20):
            where = np.flatnonzero(labels == c)
            spans.append((where[-1] - where[0] + 1) / len(labels))
    return float(np.mean(spans))


def test_dirichlet_follows_statas_slots():
    # slots=1: every class goes wholly into the one slot, which is then shuffled: an i.i.d.-like order.
    one = LABELS[Dirichlet(0.01, slots=1).order(LABELS, 0).index]
    assert _runs(one).mean() < 1.2
    # Tiny gamma: each class sits almost entirely in one slot, so a class's samples form one block in the
    # stream whenever its slot holds no other class; the histogram per tenth of the stream is then peaked.
    labels = LABELS[Dirichlet(0.001).order(LABELS, 0).index]
    tenths = np.array_split(labels, 10)
    peak = np.mean([np.bincount(t, minlength=20).max() / len(t) for t in tenths])
    iid_peak = np.mean([np.bincount(t, minlength=20).max() / len(t)
                        for t in np.array_split(LABELS[Iid().order(LABELS, 0).index], 10)])
    assert peak > 2 * iid_peak


def _statas_online_order(labels: np.ndarray, batch_size: int, gamma: float, seed: int) -> np.ndarray:
    """A transcription of StatA's online stream (MaxZanella/StatA main.py: num_slots = min(n // batch_size,
    number of classes); sampler.py OnlineSampler.create_indices), every draw from one seeded generator (StatA
    draws the proportions from an unseeded default_rng and the slot shuffles from np.random)."""
    rng = np.random.default_rng(seed)
    num_slots = min(labels.shape[0] // batch_size, len(np.unique(labels)))
    label_dict: dict[int, list[int]] = {}
    for i, label in enumerate(labels.tolist()):
        label_dict.setdefault(label, []).append(i)
    classes = sorted(label_dict)
    label_distribution = rng.dirichlet([gamma] * num_slots, len(classes))
    slot_indices: list[list[int]] = [[] for _ in range(num_slots)]
    for label in classes:
        indices = np.array(label_dict[label])
        partition = label_distribution[classes.index(label), :]
        for s, ids in enumerate(np.split(indices, (np.cumsum(partition)[:-1] * len(indices)).astype(int))):
            slot_indices[s].extend(ids)
    final: list[int] = []
    for s_ids in slot_indices:
        for i in rng.permutation(range(len(s_ids))):
            final.append(s_ids[i])
    return np.array(final)


@pytest.mark.parametrize("batch", [128, 32, 7])
@pytest.mark.parametrize("gamma", [0.1, 0.001])
def test_dirichlet_batches_rule_is_statas_online_stream(batch, gamma):
    for seed in (0, 5):
        ours = Dirichlet(gamma, slots="batches", batch=batch).order(LABELS, seed).index
        assert np.array_equal(ours, _statas_online_order(LABELS, batch, gamma, seed))
        assert np.array_equal(Dirichlet(gamma, batch=batch).order(LABELS, seed).index, ours)  # the default rule


def test_dirichlet_slot_rules():
    n, k = len(LABELS), 20
    assert Dirichlet(0.1, batch=128).num_slots(n, k) == n // 128 == 4
    assert Dirichlet(0.1, batch=16).num_slots(n, k) == k  # more batches than classes: a slot per class
    assert Dirichlet(0.1, batch=1000).num_slots(n, k) == 1  # StatA has no slot at all (and no batch) there
    assert Dirichlet(0.1, slots="classes").num_slots(n, k) == k and Dirichlet(0.1, slots=3).num_slots(n, k) == 3
    # batch size 1: the batches rule is the one-slot-per-class rule, so earlier orders are unchanged
    for seed in (0, 1):
        assert np.array_equal(Dirichlet(0.1).order(LABELS, seed).index,
                              Dirichlet(0.1, slots="classes").order(LABELS, seed).index)
    assert "min(n // 128, classes)" in Dirichlet(0.1, batch=128).describe()
    assert "one slot per class" in Dirichlet(0.1).describe()


def test_stream_for_batch_writes_the_rule_and_batch_into_dirichlet_streams():
    d = {"dirichlet": {"gamma": 0.1}}
    assert stream_for_batch(d, 1) is d and stream_for_batch("iid", 32) == "iid"
    assert stream_for_batch(d, 32) == {"dirichlet": {"gamma": 0.1, "slots": "batches", "batch": 32}}
    fixed = {"dirichlet": {"gamma": 0.1, "slots": "classes"}}
    assert stream_for_batch(fixed, 32) == fixed
    given = {"dirichlet": {"gamma": 0.1, "batch": 128}}
    assert stream_for_batch(given, 32) == given  # the spec fixed the order's batch size: every run shares it
    assert stream_for_batch({"contaminated": {"rate": 0.2, "base": d}}, 32) == {
        "contaminated": {"rate": 0.2, "base": {"dirichlet": {"gamma": 0.1, "slots": "batches", "batch": 32}}}}
    assert protocol_from_spec(stream_for_batch(d, 32)) == Dirichlet(0.1, slots="batches", batch=32)


@pytest.mark.parametrize("imbalance", [1, 10, 20, 50])
def test_longtail_keeps_an_exponential_profile_over_a_drawn_ranking(imbalance):
    labels = np.random.default_rng(1).permutation(np.repeat(np.arange(10), 100))  # balanced: 100 per class
    rankings = set()
    for seed in range(4):
        order = LongTail(imbalance).order(labels, seed)
        kept = labels[order.index]
        assert len(np.unique(order.index)) == len(order) and not order.is_ood.any()
        counts = np.bincount(kept, minlength=10)
        ranking = tuple(np.argsort(-counts, kind="stable"))
        rankings.add(ranking)
        # LDAM-DRW's profile, written plainly: rank r of K keeps int(n_max * (1 / imbalance) ** (r / (K - 1)))
        expected = [int(100 * (1 / imbalance) ** (r / 9)) for r in range(10)]
        assert sorted(counts, reverse=True) == expected
        assert counts.max() / counts.min() == pytest.approx(imbalance, rel=0.25)  # floored to whole samples
        assert not np.array_equal(order.index, np.sort(order.index))  # shuffled, not grouped
    if imbalance > 1:
        assert len(rankings) == 4  # the class ranking is drawn per order
    again = LongTail(imbalance).order(labels, 3)
    assert np.array_equal(again.index, LongTail(imbalance).order(labels, 3).index)


def test_longtail_head_is_what_every_class_can_supply():
    # the uneven LABELS: class c has 10 + 2c samples; whichever class is ranked r must hold n_head * 10^(-r / 19)
    order = LongTail(10).order(LABELS, 0)
    counts = np.bincount(LABELS[order.index], minlength=20)
    ranked = np.argsort(-counts, kind="stable")
    available = np.bincount(LABELS)[ranked]
    factor = 10.0 ** -(np.arange(20) / 19)
    head = int(np.floor(min(available / factor)))
    assert counts[ranked].tolist() == [min(a, int(np.floor(head * f))) for a, f in zip(available, factor)]
    assert (counts <= np.bincount(LABELS)).all() and counts.max() == head


def test_contaminated_rate_positions_and_flags():
    protocol = Contaminated(rate=0.2, pool="imagenet-o")
    order = protocol.order(LABELS, 5, pool_size=1000)
    m = protocol.ood_count(len(LABELS))
    assert m == round(0.2 * len(LABELS) / 0.8) and len(order) == len(LABELS) + m
    assert abs(order.is_ood.mean() - 0.2) < 0.005
    assert np.array_equal(order.source, order.is_ood.astype(np.int64))
    # In-distribution positions are the base (iid) order; OOD ones distinct pool indices.
    assert np.array_equal(order.index[~order.is_ood], Iid().order(LABELS, 5).index)
    pool = order.index[order.is_ood]
    assert len(set(pool.tolist())) == m and pool.max() < 1000
    # Spread over the stream, not bunched: each half holds about half of the OOD samples.
    half = len(order) // 2
    assert abs(order.is_ood[:half].sum() - m / 2) < 0.2 * m
    again = protocol.order(LABELS, 5, pool_size=1000)
    assert np.array_equal(order.index, again.index) and np.array_equal(order.is_ood, again.is_ood)


def test_contaminated_over_a_dirichlet_base_keeps_its_bursts():
    order = Contaminated(rate=0.1, base=Dirichlet(0.001)).order(LABELS, 0, pool_size=500)
    assert np.array_equal(order.index[~order.is_ood], Dirichlet(0.001).order(LABELS, 0).index)


def test_contaminated_pool_too_small():
    with pytest.raises(ValueError, match="needs 249 OOD samples .* has 100"):
        Contaminated(rate=0.3).order(LABELS, 0, pool_size=100)


def test_held_out_split_partitions_the_classes():
    kept, inside, outside = held_out_split(LABELS, 0.5, 3)
    assert len(kept) == 10
    assert np.array_equal(np.sort(np.concatenate([inside, outside])), np.arange(len(LABELS)))
    assert np.isin(LABELS[inside], kept).all() and not np.isin(LABELS[outside], kept).any()
    assert np.array_equal(held_out_split(LABELS, 0.5, 3)[0], kept)


def test_continual_concatenates_each_dataset_in_its_own_order():
    a, b, c = LABELS, LABELS[:100], np.arange(30) % 20
    order = Continual(("imagenet", "imagenet-v2", "imagenet-sketch")).order([a, b, c], 9)
    assert np.array_equal(np.bincount(order.source), [len(a), len(b), len(c)])
    assert np.array_equal(order.source, np.sort(order.source))  # one dataset after another
    seeds = derive_order_seeds(9, 3)
    for i, labels in enumerate((a, b, c)):
        assert np.array_equal(order.index[order.source == i], iid_permutation(len(labels), seeds[i]))
    assert not order.is_ood.any()


def test_gradual_continual_mixes_neighbours_over_a_window_with_a_linear_ramp():
    sizes, mixing = (2000, 2000, 1200), 0.5
    labels = [np.arange(n) % 20 for n in sizes]
    order = Continual(("a", "b", "c"), mixing=mixing).order(labels, 9)
    seeds = derive_order_seeds(9, 3)
    for i, n in enumerate(sizes):  # every dataset whole, in its own i.i.d. order
        assert np.array_equal(order.index[order.source == i], iid_permutation(n, seeds[i]))
    # windows: the last and first mixing / 2 of neighbours; outside them one dataset at a time
    src = order.source
    first = 2000 - 500  # a alone, the a|b window of 500 + 500, b alone, the b|c window of 500 + 300, c alone
    assert (src[:first] == 0).all() and (src[first + 1000:first + 2000] == 1).all()
    assert (src[first + 2800:] == 2).all() and set(src[first + 2000:first + 2800]) == {1, 2}
    window = src[first:first + 1000]
    # the share of b rises linearly across the window: about 1/8, 3/8, 5/8, 7/8 in its quarters
    shares = [(q == 1).mean() for q in np.split(window, 4)]
    assert shares == pytest.approx([0.125, 0.375, 0.625, 0.875], abs=0.08)
    assert np.array_equal(Continual(("a", "b"), 0.0).order(labels[:2], 9).index,
                          Continual(("a", "b")).order(labels[:2], 9).index)
    assert np.array_equal(order.index, Continual(("a", "b", "c"), mixing=mixing).order(labels, 9).index)


def test_derive_order_seeds():
    seeds = derive_order_seeds(7, 100)
    assert seeds[0] == 7 and len(set(seeds)) == 100 and all(0 <= s < 2**32 for s in seeds[1:])
    assert seeds == derive_order_seeds(7, 100) and derive_order_seeds(7, 10) == seeds[:10]
    assert derive_order_seeds(8, 5) != seeds[:5]
    orders = {tuple(Iid().order(LABELS, s).index[:20]) for s in seeds}
    assert len(orders) == 100


@pytest.mark.parametrize(("value", "expected"), [
    ("iid", Iid()), ("separate", Separate()), ({"iid": None}, Iid()),
    ({"dirichlet": {"gamma": 0.01}}, Dirichlet(0.01)),
    ({"contaminated": {"with": "imagenet-o", "rate": 0.2}}, Contaminated(0.2, "imagenet-o")),
    ({"contaminated": {"rate": 0.1, "base": {"dirichlet": {"gamma": 0.1}}}},
     Contaminated(0.1, HELD_OUT_CLASSES, Dirichlet(0.1))),
    ({"continual": ["imagenet", "imagenet-v2"]}, Continual(("imagenet", "imagenet-v2"))),
    ({"longtail": {"imbalance": 10}}, LongTail(10)),
    ({"continual": {"datasets": ["imagenet", "imagenet-v2"], "mixing": 0.2}},
     Continual(("imagenet", "imagenet-v2"), 0.2)),
])
def test_protocol_from_spec(value, expected):
    assert protocol_from_spec(value) == expected


def test_describe_names_the_parameters():
    assert "gamma=0.01" in Dirichlet(0.01).describe()
    text = Contaminated(0.2, "imagenet-o").describe()
    assert "20%" in text and "imagenet-o" in text
    assert "held-out classes" in Contaminated(0.2).describe()
    assert "imagenet, imagenet-v2" in Continual(("imagenet", "imagenet-v2")).describe()


@pytest.mark.parametrize(("make", "needle"), [
    (lambda: Dirichlet(0.0), "dirichlet gamma must be a finite number > 0, got 0.0"),
    (lambda: Dirichlet(float("nan")), "dirichlet gamma must be a finite number > 0"),
    (lambda: Dirichlet(0.1, slots=0), "dirichlet slots must be batches or classes, an integer >= 1 or null, got 0"),
    (lambda: Dirichlet(0.1, slots="class"), "dirichlet slots must be batches or classes, an integer >= 1 or null"),
    (lambda: Dirichlet(0.1, batch=0), "dirichlet batch must be an integer >= 1 or null, got 0"),
    (lambda: Dirichlet(0.1, slots="classes", batch=32), "slots 'classes' does not use it"),
    (lambda: Contaminated(rate=1.0), r"contaminated rate must be a number in \[0, 1\), got 1.0"),
    (lambda: Contaminated(rate=0.2, pool=""), "contaminated with must be a dataset name"),
    (lambda: Contaminated(rate=0.2, base=Continual(("a", "b"))), "contaminated base must be iid"),
    (lambda: Continual(("a", "b"), mixing=1.5), r"continual mixing must be a number in \[0, 1\]"),
    (lambda: protocol_from_spec({"continual": {"mixing": 0.2}}), "stream continual needs datasets"),
    (lambda: LongTail(0.5), "longtail imbalance must be a finite number >= 1"),
    (lambda: LongTail(100).order(np.repeat(np.arange(3), 50), 0),
     "longtail imbalance 100 over 3 classes needs a head class of at least 100 samples, but the classes' sizes "
     "allow only 50"),
    (lambda: protocol_from_spec({"longtail": {}}), "stream longtail needs imbalance"),
    (lambda: protocol_from_spec({"longtail": {"ratio": 10}}), "unknown stream longtail field 'ratio'"),
    (lambda: Continual(("imagenet",)), "continual needs a list of at least 2 dataset names"),
    (lambda: Continual(("a", "a")), "continual datasets must be distinct"),
    (lambda: Iid().order(LABELS, -1), "stream seed must be an integer >= 0, got -1"),
    (lambda: Iid().order(LABELS.astype(float), 0), "stream labels must be a 1-D integer array"),
    (lambda: Continual(("a", "b")).order([LABELS], 0), "continual needs labels for its 2 datasets, got 1"),
    (lambda: derive_order_seeds(0, 0), "orders must be an integer >= 1, got 0"),
    (lambda: held_out_split(LABELS, 1.0, 0), r"held-out fraction must be a number in \(0, 1\), got 1.0"),
    (lambda: protocol_from_spec("shuffled"), "unknown stream 'shuffled'; expected one of iid, dirichlet"),
    (lambda: protocol_from_spec({"dirichlet": {"alpha": 0.1}}), "unknown stream dirichlet field 'alpha'"),
    (lambda: protocol_from_spec({"dirichlet": {}}), "stream dirichlet needs gamma"),
    (lambda: protocol_from_spec({"contaminated": {"with": "x"}}), "stream contaminated needs rate"),
    (lambda: protocol_from_spec({"separate": {"gamma": 1}}), "stream separate takes no parameters"),
    (lambda: protocol_from_spec({"continual": "imagenet"}), "stream continual takes a list of dataset names"),
])
def test_bad_parameters(make, needle):
    with pytest.raises(ValueError, match=needle):
        make()
