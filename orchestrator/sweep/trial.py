"""One trial: load (or reuse) a data source's stream, run its online run(s), write every row through RunWriter.

Ray-free on purpose: the Tune trainable in `runner.py` is a thin wrapper around `execute_trial`, and the
benchmark's plain loop calls `execute_trial` directly, so both do exactly the same work. A trial of several
runs on one stream runs as a pack (`orchestrator.sweep.pack`), of several orders of one source through
`orchestrator.sweep.orders`, of one shard of a run through `orchestrator.sweep.shard`; the pieces they share
(settings, streams, the row sink, outcomes, faults) are in `orchestrator.sweep.pieces`.

Resume is exact because the method state is a deterministic function of the stream prefix: a trial replays
the whole stream and writes only the rows at or past `RunWriter.rows_done()` (the end of the run's complete
parts), so a run killed mid-way ends with exactly n rows, the same ones an uninterrupted run writes.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from orchestrator.registry import load_plugins, method_card
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.memory import MethodCost, PeakMemory
from orchestrator.sweep.orders import execute_orders
from orchestrator.sweep.pack import execute_pack
from orchestrator.sweep.pieces import (STATE_ROWS, TEXT_STAGE, WARMUP_SAMPLES, ImageSide, Outcome, Progress, RowSink,
                                       Settings, Stream, auxiliary_for, code_path, error_text, features_for,
                                       finish, image_side, load_stream, mark_failed, method_for, part_rows_for,
                                       peak_mb_of, prompt_text_for, resume_state, rows_on_disk, save_run_state,
                                       silent, trial_device, wants_views, warm_up, with_teacher)
from orchestrator.sweep.plan import Run, Trial
from orchestrator.sweep.shard import execute_shard


def deterministic_failure(trial: Trial, settings: Settings, exc: BaseException) -> str | None:
    """For an error a retry would meet again (a dataset folder missing or empty, weights not on this machine, a
    bad value): record it on the trial's unfinished runs and return its text, so the trial reports a failure
    instead of raising and being retried max_failures times. None for any other error (retried)."""
    from orchestrator.clip.backbone import WeightsNotFoundError
    from orchestrator.data.datasets import DatasetLayoutError

    if not isinstance(exc, (DatasetLayoutError, WeightsNotFoundError, ValueError, TypeError)):
        return None
    for run in trial.runs:
        writer = RunWriter(settings.results_dir, run.config)
        if not writer.complete():
            mark_failed(writer, exc)
    return error_text(exc)


def execute_run(run: Run, stream: Stream, settings: Settings, *, encode_s: float = 0.0,
                peak: PeakMemory | None = None, progress: Progress = silent, text: Any = None,
                vision: ImageSide | None = None) -> dict[str, Any]:
    """One online run over the stream, a part at a time (the method keeps its state between calls), so rows
    reach the disk while the run goes on. A method that adapts the image encoder saves its state with each part
    (`STATE_ROWS`), and a resumed run goes on from there instead of replaying the stream."""
    writer = RunWriter(settings.results_dir, run.config)
    writer.mark("running", n_samples=len(stream))
    try:
        config = run.config

        def method_for_stream() -> Any:
            return method_for(config, stream, text, vision)

        features = features_for(config, stream, vision)
        warmup_s = warm_up([code_path(config, features)],
                           lambda: method_for_stream().run(features[:WARMUP_SAMPLES],
                                                           auxiliary_for(config, stream, 0, WARMUP_SAMPLES)))
        part = part_rows_for(settings.part_rows, run.batch_size)
        sink = RowSink(writer, stream, part, settings.failpoint)
        outcome = Outcome()
        checkpointed = method_card(config.method).image_encoder is not None
        with MethodCost(features.device) as whole:  # the method's memory: its state and each part's temporaries
            method = method_for_stream()
            first = resume_state(writer, method, sink.done) if checkpointed else 0
            for start in range(first, len(stream), part):
                began = time.perf_counter()
                trace = method.run(features[start:start + part], auxiliary_for(config, stream, start, start + part))
                labels = stream.labels[start:start + part]
                rows = outcome.add(trace, labels, time.perf_counter() - began)
                if checkpointed:  # the state first: a part on disk always has its state saved (a kill between the
                    # two leaves a state ahead of the rows, which a resume does not take: it replays from the start)
                    outcome.state[STATE_ROWS] = np.array(min(start + part, len(stream)))
                    save_run_state(writer, outcome, stream)
                sink.offer(start, rows)
                progress("adapting", min(start + part, len(stream)), len(stream))
        outcome.mem_mb = whole.mb
        if first:  # the rows before `first` are on disk from before: the metrics are the whole run's, read back
            outcome.rows = rows_on_disk(writer)
        return finish(run, writer, sink.resumed_from, outcome, stream, encode_s, peak_mb_of(peak), warmup_s)
    except BaseException as exc:
        mark_failed(writer, exc)
        raise


class _RecordProgress:
    """Also writes how far the trial got into its runs' runs-table rows (the dashboard's running runs), at most
    once per `every_s` seconds of a stage, after the driver's own progress call."""

    _UNITS = {"encoding": "images", TEXT_STAGE: "prompts", "adapting": "samples"}

    def __init__(self, runs: list[Run], settings: Settings, forward: Progress,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.writers = [RunWriter(settings.results_dir, run.config) for run in runs]
        self.forward, self.every_s, self.clock = forward, settings.progress_every_s, clock
        self.stage: str | None = None
        self.last = 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        self.forward(stage, done, total)
        now = self.clock()
        if stage == self.stage and now - self.last < self.every_s and done < total:
            return
        self.stage, self.last = stage, now
        for writer in self.writers:
            writer.mark("running", progress=f"{stage} {done}/{total} {self._UNITS.get(stage, '')}".rstrip())


def execute_trial(trial: Trial, settings: Settings, progress: Progress = silent) -> list[dict[str, Any]]:
    """Run every run of a trial that is not complete yet (a finished run whose rows went missing is run again
    from its last complete part); returns one metrics dict per run executed. `progress` hears how far encoding
    and (for a single run) adapting got; the runs' rows record it too."""
    todo = [run for run in trial.runs if not RunWriter(settings.results_dir, run.config).complete()]
    if not todo:
        return []
    progress = _RecordProgress(todo, settings, progress)
    load_plugins(settings.plugins)
    keep_views = any(wants_views(run.config) for run in todo)
    with PeakMemory(trial_device()) as peak:  # this trial's own, not the reused actor process's
        if any(run.source != trial.source for run in todo):  # several orders of one data source
            return execute_orders(todo, settings, peak=peak, progress=progress)
        stream, cached = load_stream(trial.source, settings, keep_views, progress)
        encode_s = 0.0 if cached else stream.encode_s
        stream = with_teacher(stream, [run.config for run in todo], trial.source, settings, progress)
        text = prompt_text_for([run.config for run in todo], trial.source, stream)
        vision = image_side([run.config for run in todo], trial.source, stream, settings)
        if trial.shard is not None:
            return [execute_shard(todo[0], trial.shard, stream, settings, encode_s=encode_s, peak=peak,
                                  progress=progress, text=text, vision=vision)]
        if len(todo) > 1:
            if vision is not None:  # the plan gives such a run a trial of its own (`plan._make_trials`)
                raise ValueError("a pack holds a run whose method adapts the image encoder; such runs are not packed")
            return execute_pack(todo, stream, settings, encode_s=encode_s, peak=peak, text=text)
        return [execute_run(todo[0], stream, settings, encode_s=encode_s, peak=peak, progress=progress, text=text,
                            vision=vision)]
