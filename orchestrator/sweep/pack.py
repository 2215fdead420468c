"""A pack: several runs over one stream in one pass of the multi-config engine (exact per run), written as one
segment (fresh runs) or as parts from each run's rows_done."""

from __future__ import annotations

import datetime as dt
from typing import Any, Callable

import numpy as np
import torch

from orchestrator.registry import method_card
from orchestrator.results import store
from orchestrator.results.atomic import durable_batch
from orchestrator.results.schema import RunConfig
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.memory import MethodCost, PeakMemory
from orchestrator.sweep.pieces import (WARMUP_SAMPLES, Cost, Outcome, PromptTexts, RowSink, Settings, Stream,
                                       auxiliary_for, code_path, feature_kind, features_for, finished_metrics, mark_finished,
                                       mark_unfinished_failed, method_hparams, part_rows_for, peak_mb_of,
                                       save_run_state, warm_up)
from orchestrator.sweep.plan import Run

# Rows above which a pack writes parts (and is compacted later) rather than committing one segment from memory.
COMMIT_ROWS = 2_000_000


def pack_traces(runs: list[Run], stream: Stream, text: PromptTexts | None = None,
                orders: torch.Tensor | None = None
                ) -> tuple[list[Any], float, list[Cost]]:
    """Each run's trace over the stream from one pass of the multi-config engine per method and kind of features
    the runs take (views, a view axis over single features, or features; exact per run), the warm-up's seconds
    and each run's cost: its share of its method's pass (`MethodCost`'s seconds and memory over the configurations
    of the pass), so a pack of several methods gives each its own. Methods that step in one lockstep runner
    (the BCA family on views, TDA and TDA+PA, the episodic methods) share its pass and its cost, as they share
    its work. `orders` [runs, n]: run i's stream is the stream's samples in the order orders[i]
    (orchestrator.sweep.orders)."""
    from orchestrator.methods.many import run_traces_many

    def shared_pass(config: RunConfig) -> tuple:
        runner = method_card(config.method).lockstep_runner(features_for(config, stream).dim() == 3)
        return (feature_kind(config, stream), ("runner", id(runner)) if runner is not None else config.method,
                config.get("context"))   # runs from different learned contexts take different text sides

    traces: list[Any] = [None] * len(runs)
    costs: list[Cost] = [Cost(0.0, None)] * len(runs)
    passes = []
    kinds = [shared_pass(run.config) for run in runs]
    for kind in dict.fromkeys(kinds):
        picked = [i for i, k in enumerate(kinds) if k == kind]
        configs = [{"method": runs[i].method, "batch_size": runs[i].batch_size,
                    **method_hparams(runs[i].config, len(stream))} for i in picked]
        first = runs[picked[0]].config
        passes.append((picked, configs, features_for(first, stream), None if text is None else text.for_run(first),
                       first))

    def run_pass(configs: list[dict], features: torch.Tensor, prompts: Any, first: RunConfig,
                 order: torch.Tensor | None = None) -> list[Any]:
        # a teacher's features (RLCF's, the one such configuration of an order-free replay) over these samples
        return run_traces_many(features, stream.class_embeddings, stream.class_ids, stream.num_classes, configs,
                               prompts, order, auxiliary_for(first, stream, 0, len(features)))

    warmup_s = warm_up([("pack", *code_path(runs[i].config, f)) for picked, _, f, _, _ in passes for i in picked],
                       lambda: [run_pass(c, f[:WARMUP_SAMPLES], p, first) for _, c, f, p, first in passes])
    for picked, configs, features, prompts, first in passes:
        with MethodCost(features.device) as cost:
            done = run_pass(configs, features, prompts, first, None if orders is None else orders[picked])
        for i, trace in zip(picked, done):
            traces[i], costs[i] = trace, Cost(cost.seconds / len(picked), cost.mb / len(picked))
    return traces, warmup_s, costs


Made = Callable[[int], tuple["Outcome", dict[str, np.ndarray], Stream]]


def start_pack(runs: list[Run], stream_rows: int, settings: Settings) -> tuple[list[RunWriter], bool]:
    """The runs' writers, and whether the pack commits them as one segment: fresh runs (no live parts: none ran
    before) whose rows fit COMMIT_ROWS go straight into a segment, as compaction would leave them, with no live
    file at all; runs that go on from live parts (and the fault tests' failpoints, which count parts) write parts
    as a single run does, and are marked running first."""
    writers = [RunWriter(settings.results_dir, run.config) for run in runs]
    direct = (settings.failpoint is None and stream_rows * len(runs) <= COMMIT_ROWS
              and not any(writer.rows_done() for writer in writers))
    if not direct:
        for writer in writers:
            writer.mark("running", n_samples=stream_rows)
    return writers, direct


def write_pack(runs: list[Run], writers: list[RunWriter], made: Made, settings: Settings, *, direct: bool,
               started_at: dt.datetime, encode_s: float, peak_mb: float | None, warmup_s: float
               ) -> list[dict[str, Any]]:
    """Each run's rows, state and 'finished' row, `made(i)` giving run i's outcome, rows and stream when it is
    written: as one segment (`direct`, see `start_pack`: one commit, after which every run is finished, before
    which none is), or as parts from each run's rows_done, committed together (every run's rows and state, one
    barrier making them durable, then the runs' 'finished' rows and a barrier for those: durable_batch, instead of
    two fsyncs per file; a kill before a run's 'finished' row leaves its complete parts, which a resume keeps).
    The encoder and warm-up seconds go to the first run."""
    out: list[dict[str, Any]] = []
    if direct:
        tables = []
        with durable_batch():
            for i, (run, writer) in enumerate(zip(runs, writers)):
                outcome, rows, stream = made(i)
                save_run_state(writer, outcome, stream)
                metrics = finished_metrics(outcome, stream, encode_s if i == 0 else 0.0, peak_mb,
                                            warmup_s if i == 0 else 0.0)
                columns = {"image_id": stream.image_ids, "label": stream.labels.numpy(),
                           "is_ood": stream.is_ood.numpy(), "source": stream.sources}
                tables.append(writer.finished_tables({**columns, **rows}, started_at, **metrics))
                out.append({**metrics, "run_id": run.run_id, "rows_written": len(stream), "resumed_from": 0})
        store.commit_runs(settings.results_dir, tables)
        return out
    done = []
    with durable_batch() as batch:
        for i, (run, writer) in enumerate(zip(runs, writers)):
            outcome, rows, stream = made(i)
            sink = RowSink(writer, stream, part_rows_for(settings.part_rows, run.batch_size),
                            settings.failpoint)
            sink.offer(0, rows)
            save_run_state(writer, outcome, stream)
            done.append((run, writer, sink.resumed_from, outcome, stream))
        if batch is not None:
            batch.barrier()
        return [mark_finished(run, writer, resumed_from, outcome, stream, encode_s if i == 0 else 0.0, peak_mb,
                               warmup_s if i == 0 else 0.0)
                for i, (run, writer, resumed_from, outcome, stream) in enumerate(done)]


def execute_pack(runs: list[Run], stream: Stream, settings: Settings, *, encode_s: float = 0.0,
                 peak: PeakMemory | None = None, text: PromptTexts | None = None) -> list[dict]:
    """Several runs over one stream in one pass of the multi-config engine (exact per run), then the runs
    written by `write_pack` (one segment for fresh runs, else parts from each run's rows_done). A run's
    samples/s is the stream length over its share of its method's pass (`pack_traces`)."""
    started_at = dt.datetime.now(dt.timezone.utc)
    writers, direct = start_pack(runs, len(stream), settings)
    try:
        traces, warmup_s, costs = pack_traces(runs, stream, text)

        def made(i: int) -> tuple[Outcome, dict[str, np.ndarray], Stream]:
            outcome = Outcome()
            outcome.mem_mb = costs[i].mem_mb
            return outcome, outcome.add(traces[i], stream.labels, costs[i].seconds), stream

        return write_pack(runs, writers, made, settings, direct=direct, started_at=started_at, encode_s=encode_s,
                          peak_mb=peak_mb_of(peak), warmup_s=warmup_s)
    except BaseException as exc:
        mark_unfinished_failed(writers, exc)
        raise
