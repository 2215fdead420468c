"""One order-free run split into shards: contiguous ranges of its stream, each run by its own trial (its own Ray
actor, with the run's resources: a GPU of any node), merged into exactly the rows one trial writes.

A method entry's `shards: N` (orchestrator.sweep.spec) makes each of its runs N trials, for episodic methods
only (`orchestrator.methods.episodic.order_free`: the state is reset every sample, so a sample's outputs do not
depend on the samples before it). The run keeps its run_id; `Shard.rows` gives shard k of N whole parts of
`part_rows`, and a shard calls the method on exactly the part-sized slices the unsharded run calls it on, so each
part it writes is the unsharded run's part, row for row.

Reliability, per shard: each shard writes its rows through the run's one RunWriter with `fill_part` (atomic
parts under the run's lock; only rows no complete part holds), so a killed shard's retry computes and writes
only the parts of its range still missing, and a zombie of the same shard cannot write a row twice. After its
rows, a shard records what it measured in artifacts/<run_id>/shards/<k>of<N>.json; the shard that then finds
every row on disk and every shard's record (under a lock, so two cannot interleave) finishes the run as the
unsharded trial does, its metrics computed from the rows read back: the same numbers, and the same state file.
Its timing columns add up the shards' work: samples/s is per actor (samples computed over the seconds the
shards spent computing them), the stage times are sums, the peak memory the largest shard's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from orchestrator.results.atomic import atomic_write
from orchestrator.results.schema import artifacts_root, check_run_id
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.memory import PeakMemory
from orchestrator.sweep.plan import Run, Shard
from orchestrator.sweep.pieces import (WARMUP_SAMPLES, ImageSide, Outcome, Progress, Settings, Stream,
                                       auxiliary_for, code_path, features_for, finish, fire_failpoint, mark_failed, method_for,
                                       part_rows_for, peak_mb_of, rows_on_disk, silent, warm_up)


def shards_dir(results_dir: str | Path, run_id: str) -> Path:
    """artifacts/<run_id>/shards: each shard's record, and the lock under which a run is finished."""
    return artifacts_root(Path(results_dir)) / check_run_id(run_id) / "shards"


def _record_path(results_dir: str | Path, run_id: str, shard: Shard) -> Path:
    return shards_dir(results_dir, run_id) / f"{shard.index + 1}of{shard.count}.json"


def execute_shard(run: Run, shard: Shard, stream: Stream, settings: Settings, *, encode_s: float = 0.0,
                  peak: PeakMemory | None = None, progress: Progress = silent, text: Any = None,
                  vision: ImageSide | None = None) -> dict[str, Any]:
    """Compute and write the rows of the shard's range that are not on disk yet, record its timings, and finish
    the run if it is now whole (text: the text tower of a method that runs one, as the unsharded trial gives it). Returns what the shard did (rows written, samples/s) and, when it finished the
    run, the run's metrics."""
    writer = RunWriter(settings.results_dir, run.config)
    n = len(stream)
    writer.mark("running", n_samples=n)
    try:
        part = part_rows_for(settings.part_rows, run.batch_size)  # whole batches, as the unsharded run
        lo, hi = shard.rows(n, part)
        holes = writer.missing(lo, hi)
        outcome = Outcome()
        warmup_s, written, parts = 0.0, 0, 0
        if holes:
            config = run.config
            features = features_for(config, stream, vision)

            def method_for_stream() -> Any:
                return method_for(config, stream, text, vision)

            warmup_s = warm_up([code_path(config, features)],
                               lambda: method_for_stream().run(features[:WARMUP_SAMPLES],
                                                               auxiliary_for(config, stream, 0, WARMUP_SAMPLES)))
            method = method_for_stream()
            # the unsharded run's part-sized calls that hold a missing row (holes never cross a shard's range)
            for start in range(lo, hi, part):
                end = min(start + part, hi)
                wanted = [(max(a, start), min(b, end)) for a, b in holes if a < end and start < b]
                if not wanted:
                    continue
                began = time.perf_counter()
                trace = method.run(features[start:end], auxiliary_for(config, stream, start, end))
                rows = outcome.add(trace, stream.labels[start:end], time.perf_counter() - began)
                outcome.rows.clear()  # its rows go to disk; the metrics are computed from the whole run's there
                for a, b in wanted:
                    writer.fill_part(a, {
                        "image_id": stream.image_ids[a:b], "label": stream.labels[a:b].numpy(),
                        "is_ood": stream.is_ood[a:b].numpy(), "source": stream.sources[a:b],
                        **{k: v[a - start:b - start] for k, v in rows.items()}})
                    written += b - a
                    parts += 1
                    fire_failpoint(settings.failpoint, parts)
                progress("adapting", end - lo, hi - lo)
        record = {"computed": outcome.computed, "run_s": outcome.run_s, "timings": outcome.timings,
                  "warmup_s": warmup_s, "encode_s": encode_s, "peak_mem_mb": peak_mb_of(peak)}
        path = _record_path(settings.results_dir, run.run_id, shard)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: Path(tmp).write_text(json.dumps(record)), "shard record")
        done = {"run_id": run.run_id, "shard": shard.label, "n_samples": n, "rows_written": written,
                "resumed_from": holes[0][0] if holes and holes[0][0] > lo else 0,
                "samples_per_s": outcome.computed / outcome.run_s if outcome.run_s > 0 else float("nan")}
        finished = _finish_if_whole(run, writer, shard.count, stream)
        return {**done, "finished": finished is not None,
                **({k: v for k, v in finished.items() if k not in done} if finished else {})}
    except BaseException as exc:
        mark_failed(writer, exc)
        raise


def _finish_if_whole(run: Run, writer: RunWriter, count: int, stream: Stream) -> dict[str, Any] | None:
    """The run's metrics once every row is on disk and every shard has recorded its timings (then the run is
    marked finished, by whichever shard gets here first with both); None before that."""
    from filelock import FileLock

    folder = shards_dir(writer.results_dir, run.run_id)
    with FileLock(str(folder / ".lock")):
        if writer.complete():
            return None
        records = [_record_path(writer.results_dir, run.run_id, Shard(k, count)) for k in range(count)]
        if writer.rows_done() != len(stream) or not all(path.is_file() for path in records):
            return None
        shards = [json.loads(path.read_text()) for path in records]
        outcome = Outcome()
        outcome.rows = rows_on_disk(writer)
        outcome.run_s = sum(s["run_s"] for s in shards)
        outcome.computed = sum(s["computed"] for s in shards)
        for s in shards:
            for stage, seconds in s["timings"].items():
                outcome.timings[stage] = outcome.timings.get(stage, 0.0) + seconds
        peaks = [s["peak_mem_mb"] for s in shards if s["peak_mem_mb"] is not None]
        return finish(run, writer, 0, outcome, stream, sum(s["encode_s"] for s in shards),
                       max(peaks) if peaks else None, sum(s["warmup_s"] for s in shards))
