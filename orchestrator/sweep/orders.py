"""A trial over several stream orders of one data source (a spec's `orders: N`): the source's features loaded
once, each order laid over them as a permutation, and every run written in its own order (as a pack's runs are:
`pack.write_pack`, one segment for fresh runs).

`plan.make_trials` packs the runs of one data source's orders together (by cost, or on a GPU by memory, as
`pack:` does), a configuration's orders next to each other:

- An episodic method (`orchestrator.methods.episodic.order_free`: Zero, MTA, TPS, TPT, C-TPT, R-TPT) resets its
  state every sample, so a sample's outputs depend on that sample alone and a configuration's N orders hold the
  same rows in N orders. Each configuration is computed once, over the first run's stream, and each run's rows
  are those per-sample outputs gathered into its own order (a replay). The paper's study runs every method over
  100 orders: for these methods that is 100 times less compute (`benchmarks.study` projects it).
- Every other run is one stream of a multi-config pass over the shared features with its own order
  (`run_traces_many(..., orders=...)`): a runner that steps orders together (`lockstep.steps_orders`) runs them
  in one batched pass; any other runs each order's streams in turn, as separate trials would, without loading
  the features again.

Exact: a replayed run's rows are the per-sample outputs its pass computes, each sample's from its own
features; only where a row is written depends on the order. A lockstep pass batches samples or streams, so
where a method's products round differently in another batch (TPS's samples; the orders a runner steps
together) a run may differ from the same run alone by that rounding, as a pack's runs may
(`tests/test_sweep_orders.py` compares them with each run in its own trial). Each order's arrangement is drawn
by the stream protocol from the benchmarks' labels alone (features dropped); an order holding a sample the
first order's stream does not hold (a stream contaminated from another dataset's pool draws its OOD samples
per order; a long-tailed stream draws its subset per order) runs as a trial of its own order.

A replayed run records its configuration's samples/s (the pass's seconds shared among the configurations it
computed, as a pack's runs share theirs), the same for each of its orders, and its share of the stage times.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter, OrderedDict
from typing import Any

import numpy as np
import torch

from orchestrator.data.arrange import Arranged, arrange
from orchestrator.data.types import Benchmark
from orchestrator.methods.episodic import order_free
from orchestrator.sweep.memory import PeakMemory
from orchestrator.sweep.plan import DataSource, Run, order_class
from orchestrator.sweep.pack import execute_pack, pack_traces, start_pack, write_pack
from orchestrator.sweep.pieces import (Outcome, Progress, Settings, Stream, load_benchmarks, load_stream,
                                       mark_unfinished_failed, peak_mb_of, prompt_text_for, reduces_views,
                                       remember_stream, stream_from, to_numpy, trace_rows, wants_views,
                                       with_teacher)


def _skeleton(bench: Benchmark) -> Benchmark:
    """The benchmark without its features' values (width 0, not a view that would hold them): enough for a
    protocol to arrange an order."""
    return dataclasses.replace(bench, features=bench.features.new_empty((*bench.features.shape[:-1], 0)))


def in_order(source: DataSource, computed: Stream, skeleton: tuple[Benchmark, ...]
             ) -> tuple[Arranged, np.ndarray] | None:
    """`source`'s order of the data (its arrangement, features dropped) and, per position, the position in
    `computed` (a stream of another order of the same data) holding the same sample; None if its order holds a
    sample `computed` lacks."""
    arranged = arrange(skeleton[0], source.protocol(), source.order_seed, others=skeleton[1:],
                       split_seed=source.seed)
    # an order of another length (a long-tailed subset per order) is not a permutation of `computed`
    if list(arranged.class_names) != computed.class_names or len(arranged.order) != len(computed.order):
        return None
    width = int(max(computed.order.numpy().max(initial=0), arranged.order.numpy().max(initial=0))) + 1
    have = (computed.source_index * width + computed.order).numpy()
    want = (arranged.source_index * width + arranged.order).numpy()
    sorter = np.argsort(have, kind="stable")
    at = np.searchsorted(have, want, sorter=sorter)
    if len(have) == 0 or (at >= len(have)).any():
        return None
    perm = sorter[at]
    if not (np.array_equal(have[perm], want) and torch.equal(computed.labels[perm], arranged.labels)):
        return None
    return arranged, perm


def _laid_stream(computed: Stream, arranged: Arranged, perm: np.ndarray) -> Stream:
    """The stream of an order laid out from `computed` (built when its run is written: one order's features at a
    time on the device)."""
    index = torch.from_numpy(perm).to(computed.features.device)
    return Stream(features=computed.features[index], view_features=None, labels=arranged.labels,
                  image_ids=arranged.image_ids, order=arranged.order, source_index=arranged.source_index,
                  is_ood=arranged.is_ood, sources=arranged.sources, class_embeddings=computed.class_embeddings,
                  class_ids=computed.class_ids, num_classes=computed.num_classes, class_names=computed.class_names,
                  encode_s=0.0, skipped=computed.skipped, fingerprint=computed.fingerprint)


Laid = dict[DataSource, tuple[Arranged, np.ndarray]]


# Skeletons kept per process (labels and ids, no features), keyed by the source's first order: a reused actor's next
# trial over the same data arranges its orders without loading the features again (its stream is in
# sweep.pieces' memo).
_SKELETONS: OrderedDict[tuple[DataSource, bool], tuple[Benchmark, ...]] = OrderedDict()


def _source_data(first: DataSource, settings: Settings, keep_views: bool, progress: Progress
                 ) -> tuple[Stream, tuple[Benchmark, ...], float]:
    """The stream of `first`, its data's skeleton and the encoder seconds this trial spent, loading the
    benchmarks at most once."""
    key = (dataclasses.replace(first, order_index=0), keep_views)
    if key in _SKELETONS:
        _SKELETONS.move_to_end(key)
        stream, cached = load_stream(first, settings, keep_views, progress)
        return stream, _SKELETONS[key], 0.0 if cached else stream.encode_s
    benches = load_benchmarks(first, settings, reduces_views(first, keep_views), progress)
    computed = remember_stream(first, keep_views, stream_from(first, benches, keep_views))
    _SKELETONS[key] = tuple(_skeleton(bench) for bench in benches)
    while len(_SKELETONS) > 2:
        _SKELETONS.popitem(last=False)
    return computed, _SKELETONS[key], computed.encode_s


def execute_orders(runs: list[Run], settings: Settings, *, peak: PeakMemory | None = None,
                   progress: Progress) -> list[dict[str, Any]]:
    """The runs (over several orders of one data source): order-free configurations computed once and replayed,
    the others stepped over their orders on the shared features. One metrics dict per run, as `execute_pack`."""
    first = runs[0].source
    keep_views = any(wants_views(run.config) for run in runs)
    computed, skeleton, encode_s = _source_data(first, settings, keep_views, progress)
    computed = with_teacher(computed, [run.config for run in runs], first, settings, progress)  # a replayed RLCF reads its teacher's
    laid: dict[DataSource, tuple[Arranged, np.ndarray] | None] = {}
    for run in runs:
        if run.source not in laid:
            laid[run.source] = in_order(run.source, computed, skeleton)
    here = {source: pair for source, pair in laid.items() if pair is not None}
    replayed = [run for run in runs if run.source in here and order_free(run.method)]
    stepped = [run for run in runs if run.source in here and not order_free(run.method)]
    out = _replay(replayed, computed, here, settings, peak, encode_s) if replayed else []
    out += _step(stepped, computed, here, settings, peak, 0.0 if replayed else encode_s) if stepped else []
    elsewhere = [run for run in runs if run.source not in here]
    for source in dict.fromkeys(run.source for run in elsewhere):
        own = [run for run in elsewhere if run.source == source]
        stream, _ = load_stream(source, settings, keep_views, progress)
        stream = with_teacher(stream, [run.config for run in own], source, settings, progress)
        out += execute_pack(own, stream, settings, peak=peak,
                            text=prompt_text_for([run.config for run in own], source, stream))
    return out


def _replay(runs: list[Run], computed: Stream, laid: Laid, settings: Settings, peak: PeakMemory | None,
            encode_s: float) -> list[dict[str, Any]]:
    started_at = dt.datetime.now(dt.timezone.utc)
    writers, direct = start_pack(runs, len(computed), settings)
    try:
        classes = [order_class(run) for run in runs]
        first: dict[tuple, Run] = {}
        for key, run in zip(classes, runs):
            first.setdefault(key, run)
        text = prompt_text_for([run.config for run in first.values()], runs[0].source, computed)
        traces, warmup_s, costs = pack_traces(list(first.values()), computed, text)
        rows = {key: trace_rows(trace, computed.labels) for key, trace in zip(first, traces)}
        by_class = dict(zip(first, traces))
        cost_of = dict(zip(first, costs))
        served = Counter(classes)

        def made(i: int) -> tuple[Outcome, dict[str, np.ndarray], Stream]:
            # a run's samples/s and latency are its configuration's (its method's pass shared among the
            # configurations computed), so the cost model learns what computing a configuration costs; its stage
            # times are its share, so that they add up to the pass's over the runs
            key, (arranged, perm) = classes[i], laid[runs[i].source]
            outcome = Outcome()
            outcome.state = {k: to_numpy(v) for k, v in by_class[key].state.items()}
            outcome.mem_mb = cost_of[key].mem_mb
            mine = outcome.add_rows({name: column[perm] for name, column in rows[key].items()}, cost_of[key].seconds,
                                    {stage: t / served[key] for stage, t in by_class[key].timings.items()})
            return outcome, mine, _laid_stream(computed, arranged, perm)

        return write_pack(runs, writers, made, settings, direct=direct, started_at=started_at, encode_s=encode_s,
                          peak_mb=peak_mb_of(peak), warmup_s=warmup_s)
    except BaseException as exc:
        mark_unfinished_failed(writers, exc)
        raise


def _step(runs: list[Run], computed: Stream, laid: Laid, settings: Settings, peak: PeakMemory | None,
          encode_s: float) -> list[dict[str, Any]]:
    started_at = dt.datetime.now(dt.timezone.utc)
    writers, direct = start_pack(runs, len(computed), settings)
    try:
        orders = torch.from_numpy(np.stack([laid[run.source][1] for run in runs])).to(computed.features.device)
        text = prompt_text_for([run.config for run in runs], runs[0].source, computed)
        traces, warmup_s, costs = pack_traces(runs, computed, text, orders)

        def made(i: int) -> tuple[Outcome, dict[str, np.ndarray], Stream]:
            stream = _laid_stream(computed, *laid[runs[i].source])
            outcome = Outcome()
            outcome.mem_mb = costs[i].mem_mb
            return outcome, outcome.add(traces[i], stream.labels, costs[i].seconds), stream

        return write_pack(runs, writers, made, settings, direct=direct, started_at=started_at, encode_s=encode_s,
                          peak_mb=peak_mb_of(peak), warmup_s=warmup_s)
    except BaseException as exc:
        mark_unfinished_failed(writers, exc)
        raise
