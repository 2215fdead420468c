"""Order-free runs replayed across stream orders: an episodic method's configuration computed once, its rows
written in every order.

An episodic method (`orchestrator.methods.episodic.order_free`: Zero, MTA, TPS, TPT, C-TPT, R-TPT) resets its
state every sample, so a sample's outputs depend on that sample alone: the runs of one configuration over a
spec's `orders: N` hold the same rows in N orders. A replay trial (`plan.make_trials` makes one wherever such
runs span more than one order) runs each of its configurations once, over its first run's stream, and writes
each run's rows by gathering those per-sample outputs into the run's own order. The paper's study runs every
method over 100 orders: for these methods that is 100 times less compute (`benchmarks.study` measures it).

Exact: a run's rows are the per-sample outputs its own pass computes, each sample's from its own views; only
the position a row is written at depends on the order. (A lockstep pass batches samples, so where a method's
products round differently in another batch composition, MTA's, a run in its own order may differ from its
replay by that rounding, as a pack's runs may from their single runs; `tests/test_sweep_replay.py` compares
replayed runs with runs of their own orders.) Each order's arrangement is drawn by the stream protocol from
the benchmarks' labels alone (features dropped), and a run whose order holds a sample the computed stream does
not hold (no protocol here draws such orders) is run in its own order instead.

Each run records its configuration's samples/s (the pass's seconds shared among the configurations it
computed, as a pack's runs share theirs), the same for each of its orders, and its share of the stage times.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import numpy as np
import torch

from orchestrator.data.arrange import arrange
from orchestrator.data.types import Benchmark
from orchestrator.results.schema import canonical_json
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.memory import PeakMemory
from orchestrator.sweep.plan import DataSource, Run
from orchestrator.sweep.trial import (Progress, Settings, Stream, _finish, _Outcome, _peak_mb, _prompt_text, _rows,
                                      _RowSink, _batch_size, _wants_views, execute_pack, load_benchmarks,
                                      load_stream, mark_unfinished_failed, pack_traces, part_rows_for,
                                      reduces_views, remember_stream, stream_from)


def replay_key(run: Run) -> str:
    """What a replayed run shares with the runs of its other orders: its config without the order."""
    return canonical_json({k: v for k, v in run.config.items() if k != "order_index"})


def _skeleton(bench: Benchmark) -> Benchmark:
    """The benchmark without its features' values (width 0): enough for a protocol to arrange an order."""
    return dataclasses.replace(bench, features=bench.features[..., :0])


def in_order(source: DataSource, computed: Stream, skeleton: tuple[Benchmark, ...]
             ) -> tuple[Stream, np.ndarray] | None:
    """`source`'s stream laid out from `computed` (a stream of another order of the same data) and, per position,
    the position in `computed` holding the same sample; None if its order holds a sample `computed` lacks."""
    arranged = arrange(skeleton[0], source.protocol(), source.order_seed, others=skeleton[1:],
                       split_seed=source.seed)
    if list(arranged.class_names) != computed.class_names:
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
    index = torch.from_numpy(perm).to(computed.features.device)
    stream = Stream(features=computed.features[index], view_features=None, labels=arranged.labels,
                    image_ids=arranged.image_ids, order=arranged.order, source_index=arranged.source_index,
                    is_ood=arranged.is_ood, sources=arranged.sources, class_embeddings=computed.class_embeddings,
                    class_ids=computed.class_ids, num_classes=computed.num_classes,
                    class_names=computed.class_names, encode_s=0.0, skipped=computed.skipped,
                    fingerprint=computed.fingerprint)
    return stream, perm


def execute_replay(runs: list[Run], settings: Settings, *, peak: PeakMemory | None = None,
                   progress: Progress) -> list[dict[str, Any]]:
    """The runs (one or more configurations of an episodic method, each over one or more orders of one data
    source): each configuration computed once over the first run's stream, every run's rows written in its order.
    Returns one metrics dict per run, as `execute_pack` does."""
    first = runs[0].source
    keep_views = any(_wants_views(run.config) for run in runs)
    benches = load_benchmarks(first, settings, reduces_views(first, keep_views), progress)
    computed = remember_stream(first, keep_views, stream_from(first, benches, keep_views))
    skeleton = tuple(_skeleton(bench) for bench in benches)
    laid: dict[DataSource, tuple[Stream, np.ndarray] | None] = {}
    for run in runs:
        if run.source not in laid:
            laid[run.source] = in_order(run.source, computed, skeleton)
    del benches, skeleton
    elsewhere = [run for run in runs if laid[run.source] is None]
    replayed = [run for run in runs if laid[run.source] is not None]
    out = _replay(replayed, computed, laid, settings, peak) if replayed else []
    for source in dict.fromkeys(run.source for run in elsewhere):
        own = [run for run in elsewhere if run.source == source]
        stream, _ = load_stream(source, settings, keep_views, progress)
        out += execute_pack(own, stream, settings, peak=peak,
                            text=_prompt_text([run.config for run in own], source, stream))
    return out


def _replay(runs: list[Run], computed: Stream, laid: dict[DataSource, tuple[Stream, np.ndarray] | None],
            settings: Settings, peak: PeakMemory | None) -> list[dict[str, Any]]:
    writers = [RunWriter(settings.results_dir, run.config) for run in runs]
    for writer in writers:
        writer.mark("running", n_samples=len(computed))
    try:
        keys = [replay_key(run) for run in runs]
        first: dict[str, Run] = {}
        for key, run in zip(keys, runs):
            first.setdefault(key, run)
        text = _prompt_text([run.config for run in first.values()], runs[0].source, computed)
        traces, warmup_s, pass_s = pack_traces(list(first.values()), computed, text)
        rows = {key: _rows(trace, computed.labels) for key, trace in zip(first, traces)}
        timings = dict(zip(first, (trace.timings for trace in traces)))
        served = Counter(keys)
        # a run's samples/s is its configuration's (the pass's seconds shared among the configurations computed),
        # so the cost model learns what computing a configuration costs; its stage times are its share, so that
        # they add up to the pass's over the runs
        share = pass_s / len(first)
        out = []
        for i, (run, writer, key) in enumerate(zip(runs, writers, keys)):
            stream, perm = laid[run.source]
            outcome = _Outcome()
            sink = _RowSink(writer, stream, part_rows_for(settings.part_rows, _batch_size(run.config)),
                            settings.failpoint)
            sink.offer(0, outcome.add_rows({name: column[perm] for name, column in rows[key].items()}, share,
                                           {stage: t / served[key] for stage, t in timings[key].items()}))
            out.append(_finish(run, writer, sink.resumed_from, outcome, stream,
                               computed.encode_s if i == 0 else 0.0, _peak_mb(peak), warmup_s if i == 0 else 0.0))
        return out
    except BaseException as exc:
        mark_unfinished_failed(writers, exc)
        raise
