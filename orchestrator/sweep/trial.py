"""One trial: load (or reuse) a data source's stream, run its online run(s), write every row through RunWriter.

Ray-free on purpose: the Tune trainable in `runner.py` is a thin wrapper around `execute_trial`, and the
benchmark's plain loop calls `execute_trial` directly, so both do exactly the same work.

Streams are memoised per process, keyed by the DataSource (backbone, dataset, views, templates, seed): with
`reuse_actors=True` a Tune actor runs trial after trial, and every trial after the first on the same source
skips loading. Real datasets come through the feature cache (`load_benchmark`), which encodes each cache key
once across all processes (file lock), so at most the first trial of a source pays for the encoder.

Resume is exact because the method state is a deterministic function of the stream prefix: a trial replays
the whole stream and writes only the rows at or past `RunWriter.rows_done()` (the end of the run's complete
parts), so a run killed mid-way ends with exactly n rows, the same ones an uninterrupted run writes.

Fault injection (the reliability tests): BCA_SWEEP_FAILPOINT="<action>:<parts>:<flag file>" in the driver's
environment (the runner forwards it to every trial through Settings, so it reaches workers of a running
cluster too) makes the first trial that has written <parts> parts of one run, with <flag file> absent, create
the flag and then `sigkill` its own process, `raise` an error, or `stall` (sleep) until killed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from orchestrator.data.arrange import arrange
from orchestrator.data.streams import Contaminated
from orchestrator.data.types import Benchmark
from orchestrator.device import auto_device
from orchestrator.methods import make_method
from orchestrator.registry import ensure_dataset, load_plugins, method_card
from orchestrator.results import store
from orchestrator.results.atomic import durable_batch
from orchestrator.results.metrics import TOP_K, run_metrics, stored_run_metrics
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.memory import MethodCost, PeakMemory
from orchestrator.stages import ENCODER_STAGE, METHOD_STAGES, stage_column
from orchestrator.sweep.plan import DataSource, Run, Trial
from orchestrator.sweep.spec import SweepSpec

FAILPOINT_ENV = "BCA_SWEEP_FAILPOINT"
# Streams kept per process: one source is all a trial needs; a second spares reloading when trials of two
# sources interleave on one actor. ImageNet with AugMix views is gigabytes, so no more than that.
_MEMO_SIZE = 2
_MEMO: OrderedDict[tuple[DataSource, bool], Stream] = OrderedDict()
# What a trial says about itself while it runs: (stage, done, total) with stage 'encoding' (images),
# TEXT_STAGE (prompts) or 'adapting' (samples). The runner forwards it to the driver's progress lines.
Progress = Callable[[str, int, int], None]
TEXT_STAGE = "encoding prompts"


def _silent(stage: str, done: int, total: int) -> None:
    return None


@dataclass(frozen=True)
class Settings:
    """What every trial of a sweep shares: absolute paths (Tune changes the working directory) and part size."""

    results_dir: str
    cache_dir: str | None
    data_root: str | None
    part_rows: int
    failpoint: str | None = None  # see the module docstring
    plugins: tuple[str, ...] = ()  # modules registering plugin methods, imported in each trial process
    progress_every_s: float = 30.0  # how often a running trial tells the driver how far it got


def settings_of(spec: SweepSpec, progress_every_s: float = 30.0) -> Settings:
    """A sweep's trial settings (here, not in the runner, so that a trial runs where Ray is not installed:
    `benchmarks.gpu`)."""
    return Settings(results_dir=spec.results_dir, cache_dir=spec.cache_dir, data_root=spec.data_root,
                    part_rows=spec.part_rows, failpoint=parse_failpoint(os.environ.get(FAILPOINT_ENV)),
                    plugins=tuple(spec.plugins), progress_every_s=progress_every_s)


@dataclass
class Stream:
    """A data source ready to run, everything in stream order."""

    features: torch.Tensor               # [n, d]: the single view, or the AugMix views' selected mean
    view_features: torch.Tensor | None   # [n, V, d] for runs that take views (`wants_views`); else None
    labels: torch.Tensor                 # [n] int64, -1 for an OOD sample
    image_ids: list[str]
    order: torch.Tensor                  # [n] int64: index of each stream position in its source dataset
    source_index: torch.Tensor           # [n] int64: which of the source's datasets (0: the run's own)
    is_ood: torch.Tensor                 # [n] bool: from outside the label space (contaminated streams)
    sources: list[str]                   # [n] the dataset each sample comes from
    class_embeddings: torch.Tensor
    class_ids: torch.Tensor
    num_classes: int
    class_names: list[str]               # the label space's names (prompt-tuning methods tokenize them)
    encode_s: float                      # encoder time spent producing these features in this process
    skipped: list[dict[str, str]]        # unreadable images left out of the stream: {image_id, reason}
    fingerprint: str | None = None       # the real dataset's image list (ImageList.fingerprint, 16 hex)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _benchmark(source: DataSource, dataset: str, settings: Settings, reduce_views: bool,
               progress: Progress) -> Benchmark:
    """One dataset of a source as a Benchmark in dataset order: generated, or read through the feature cache."""
    if source.is_synthetic:
        from orchestrator.data.synthetic import synthesize

        return synthesize(source.synthetic, seed=source.seed, **source.params())
    from orchestrator.features import load_benchmark

    ensure_dataset(dataset, settings.data_root)  # a folder dataset is registered in each trial process too
    if source.model_config is not None:
        from orchestrator.sweep.catalog import register_model_config

        register_model_config(source.model_config)
    return load_benchmark(dataset, data_root=settings.data_root, cache_dir=settings.cache_dir, backbone=source.model,
                          pretrained=source.weights, views=source.views, templates=source.templates,
                          seed=source.seed, quick_gelu=source.quick_gelu, reduce_views=reduce_views,
                          progress=lambda done, total: progress("encoding", done, total),
                          text_progress=lambda done, total: progress(TEXT_STAGE, done, total))


def load_benchmarks(source: DataSource, settings: Settings, reduce_views: bool,
                    progress: Progress = _silent) -> tuple[Benchmark, ...]:
    """The source's benchmarks in dataset order: its own dataset, then the protocol's others."""
    bench = _benchmark(source, source.dataset, settings, reduce_views, progress)
    return (bench, *(_benchmark(source, name, settings, reduce_views, progress) for name in source.others))


def reduces_views(source: DataSource, keep_views: bool) -> bool:
    """Whether the source's benchmarks are loaded with views reduced to their confident means: not where runs
    take the views, and not for a held-out split, which changes the label space the views are reduced against."""
    return not keep_views and not isinstance(source.protocol(), Contaminated)


def stream_from(source: DataSource, benches: tuple[Benchmark, ...], keep_views: bool) -> Stream:
    """The source's stream from its loaded benchmarks (`load_benchmarks`): arranged in its order, on the device."""
    encode_s = sum(getattr(b, "encode_seconds", 0.0) for b in benches)
    skipped = [skip for b in benches for skip in getattr(b, "skipped", [])]
    arranged = arrange(benches[0], source.protocol(), source.order_seed, others=benches[1:], split_seed=source.seed)
    listing = getattr(benches[0], "listing_sha256", "")  # a real dataset's image list (synthetic data has none)
    device = auto_device()
    features = arranged.features.to(device)
    class_embeddings = arranged.class_embeddings.to(device)
    class_ids = arranged.class_ids.to(device)
    num_classes = len(arranged.class_names)
    view_features = None
    if features.ndim == 3:
        from orchestrator.clip import select_views

        view_features = features
        features = select_views(view_features, class_embeddings, class_ids, num_classes)
        if not keep_views:
            view_features = None
    return Stream(features=features, view_features=view_features, labels=arranged.labels,
                  image_ids=arranged.image_ids, order=arranged.order, source_index=arranged.source_index,
                  is_ood=arranged.is_ood, sources=arranged.sources, class_embeddings=class_embeddings,
                  class_ids=class_ids, num_classes=num_classes, class_names=list(arranged.class_names),
                  encode_s=encode_s, skipped=skipped,
                  fingerprint=listing[:16] or None)


def load_stream(source: DataSource, settings: Settings, keep_views: bool = False,
                progress: Progress = _silent) -> tuple[Stream, bool]:
    """(stream, was it already in this process's memo). `keep_views`: also hold every AugMix view (for runs
    that take views: zero, tda, tda_pa, the BCA family's view_selection='adaptive');
    otherwise only the confident-view means are built, without a float32 copy of all views."""
    key = (source, keep_views)
    if key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key], True
    benches = load_benchmarks(source, settings, reduces_views(source, keep_views), progress)
    return remember_stream(source, keep_views, stream_from(source, benches, keep_views)), False


def remember_stream(source: DataSource, keep_views: bool, stream: Stream) -> Stream:
    """Keep a built stream in this process's memo (the next trials of its source skip loading)."""
    _MEMO[(source, keep_views)] = stream
    while len(_MEMO) > _MEMO_SIZE:
        _MEMO.popitem(last=False)
    return stream


# --------------------------------------------------------------------------------------------- faults

def parse_failpoint(text: str | None) -> str | None:
    """Validate a failpoint string in the driver, so a typo fails the sweep at start, not inside a trial."""
    if not text:
        return None
    action, _, rest = text.partition(":")
    parts, _, flag = rest.partition(":")
    if action not in ("sigkill", "raise", "stall") or not parts.isdigit() or not flag:
        raise ValueError(f"{FAILPOINT_ENV}={text!r}: expected '<sigkill|raise|stall>:<parts>:<flag file>'")
    return text


def _failpoint(spec: str | None, parts_written: int) -> None:
    if not spec:
        return
    action, parts, flag = spec.split(":", 2)
    if parts_written != int(parts):
        return
    try:  # created atomically: of trials reaching the point together, exactly one fires
        fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as file:
        file.write(str(os.getpid()))
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stall":
        while True:
            time.sleep(60)
    else:
        raise RuntimeError(f"failpoint {FAILPOINT_ENV} fired after {parts} parts")


# ----------------------------------------------------------------------------------------------- runs

class _RowSink:
    """Writes a run's rows from `rows_done` on, in parts of at most `part_rows`, firing the failpoint after each."""

    def __init__(self, writer: RunWriter, stream: Stream, part_rows: int, failpoint: str | None) -> None:
        self.writer, self.stream, self.part_rows, self.failpoint = writer, stream, part_rows, failpoint
        self.done = writer.rows_done()
        self.resumed_from = self.done
        self.parts = 0

    def offer(self, start: int, rows: dict[str, np.ndarray]) -> None:
        """Rows start..start+len-1 of the stream (the method's outputs per sample); only those not yet on disk
        are written, with the stream's own columns."""
        end = start + len(rows["pred"])
        while self.done < end:
            lo = self.done
            hi = min(end, lo + self.part_rows)
            a, b = lo - start, hi - start
            self.done = self.writer.write_part(lo, {
                "image_id": self.stream.image_ids[lo:hi], "label": self.stream.labels[lo:hi].numpy(),
                "is_ood": self.stream.is_ood[lo:hi].numpy(), "source": self.stream.sources[lo:hi],
                **{k: v[a:b] for k, v in rows.items()}})
            self.parts += 1
            _failpoint(self.failpoint, self.parts)


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _mark_failed(writer: RunWriter, exc: BaseException) -> None:
    """Record why a run stopped (KeyboardInterrupt included); never let the recording hide the cause."""
    try:
        writer.mark("failed", error=_error_text(exc))
    except Exception:  # noqa: BLE001 - e.g. the results dir became unwritable: the original error matters more
        pass


def _rows(trace: Any, labels: torch.Tensor) -> dict[str, np.ndarray]:
    """The per-sample columns a trace gives: prediction, confidence, top-5 classes, the true class's probability
    (NaN for an OOD sample, label -1), and the method's gate and selection."""
    post = trace.posteriors
    # A stable sort, not topk: among tied posteriors (a uniform row) topk's pick is unspecified, and the stored
    # prediction must be the trace's argmax (the first maximum) that every reference and the official codes take.
    ranked = torch.sort(post, dim=1, descending=True, stable=True)
    values, classes = ranked.values[:, :TOP_K], ranked.indices[:, :TOP_K]
    labels = labels.to(post.device)
    prob_true = post.gather(1, labels.clamp_min(0)[:, None])[:, 0].masked_fill(labels < 0, float("nan"))
    return {"pred": _numpy(classes[:, 0]), "confidence": _numpy(values[:, 0]), "top5": _numpy(classes),
            "prob_true": _numpy(prob_true), "gated": _numpy(trace.gated), "gated_prior": _numpy(trace.gated_prior),
            "selected": _numpy(trace.selected)}


@dataclass(frozen=True)
class Cost:
    """A run's share of its method's pass: seconds, and peak memory in MiB (None where not measured)."""

    seconds: float
    mem_mb: float | None


class _Outcome:
    """A run's per-sample outputs over the whole stream and its timings, ready to finish."""

    def __init__(self) -> None:
        self.rows: list[dict[str, np.ndarray]] = []
        self.timings: dict[str, float] = {}
        self.run_s = 0.0
        self.computed = 0  # samples the method ran in run_s (a replayed prefix included)
        self.state: dict[str, np.ndarray] = {}
        self.mem_mb: float | None = None  # the method's own peak memory (MethodCost), its share in a pack

    def add(self, trace: Any, labels: torch.Tensor, seconds: float) -> dict[str, np.ndarray]:
        self.state = {k: _numpy(v) for k, v in trace.state.items()}
        return self.add_rows(_rows(trace, labels), seconds, trace.timings)

    def add_rows(self, rows: dict[str, np.ndarray], seconds: float, timings: dict[str, float]
                 ) -> dict[str, np.ndarray]:
        """Per-sample rows (`_rows`) that took `seconds`, split into `timings` by stage."""
        self.run_s += seconds
        self.computed += len(rows["pred"])
        for stage, t in timings.items():
            self.timings[stage] = self.timings.get(stage, 0.0) + t
        self.rows.append(rows)
        return rows

    def column(self, name: str) -> np.ndarray:
        return np.concatenate([r[name] for r in self.rows])


def _finish(run: Run, writer: RunWriter, resumed_from: int, outcome: _Outcome, stream: Stream,
            encode_s: float, peak_mb: float | None, warmup_s: float = 0.0) -> dict[str, Any]:
    """Save the final state and stream order, mark the run finished with its metrics (from the run's rows in
    `outcome`); return them."""
    _save_state(writer, outcome, stream)
    return _mark_finished(run, writer, resumed_from, outcome, stream, encode_s, peak_mb, warmup_s)


def _save_state(writer: RunWriter, outcome: _Outcome, stream: Stream) -> None:
    writer.save_state({**outcome.state, "class_ids": _numpy(stream.class_ids), "stream_order": _numpy(stream.order),
                       "stream_source": _numpy(stream.source_index)})


def _mark_finished(run: Run, writer: RunWriter, resumed_from: int, outcome: _Outcome, stream: Stream,
                   encode_s: float, peak_mb: float | None, warmup_s: float) -> dict[str, Any]:
    """Mark the run finished with its metrics (from its rows in `outcome`), its rows and state already written;
    return them."""
    metrics = _finished_metrics(outcome, stream, encode_s, peak_mb, warmup_s)
    writer.mark("finished", **metrics)
    n = len(stream)
    return {**metrics, "run_id": run.run_id, "rows_written": n - resumed_from, "resumed_from": resumed_from}


def _finished_metrics(outcome: _Outcome, stream: Stream, encode_s: float, peak_mb: float | None,
                      warmup_s: float) -> dict[str, Any]:
    """A finished run's runs-table metrics, from its rows in `outcome`."""
    n = len(stream)
    labels, is_ood = stream.labels.numpy(), stream.is_ood.numpy()
    preds = outcome.column("pred")
    measured = run_metrics(correct=preds == labels, confidence=outcome.column("confidence"), labels=labels,
                           top5_classes=outcome.column("top5"), prob_true=outcome.column("prob_true"), is_ood=is_ood,
                           preds=preds)
    metrics = {"n_samples": n, **stored_run_metrics(measured), "n_ood": int(is_ood.sum()),
               "samples_per_s": outcome.computed / outcome.run_s if outcome.run_s > 0 else float("inf"),
               "latency_ms": 1000 * outcome.run_s / outcome.computed if outcome.computed else None,
               "method_mem_mb": outcome.mem_mb,
               "warmup_s": warmup_s,
               stage_column(ENCODER_STAGE): encode_s,
               **{stage_column(stage): outcome.timings.get(stage, 0.0) for stage in METHOD_STAGES},
               "peak_mem_mb": peak_mb,
               "n_skipped": len(stream.skipped), "skipped": json.dumps(stream.skipped), "progress": None,
               "data_fingerprint": stream.fingerprint}
    return metrics


def _peak_mb(peak: PeakMemory | None) -> float | None:
    return None if peak is None else peak.mb()


def _wants_views(config: dict[str, Any]) -> bool:
    return method_card(config["method"]).wants_views(config["hparams"])


def _feature_kind(config: dict[str, Any], stream: Stream) -> str:
    """What `_features_for` hands the run: 'views', 'one view' (a view method on a single-view stream) or
    'features'; the runs of a pack's pass share one kind."""
    if stream.view_features is not None and _wants_views(config):
        return "views"
    return "one view" if method_card(config["method"]).takes_views else "features"


def _features_for(config: dict[str, Any], stream: Stream, vision: ImageSide | None = None) -> Any:
    """The views [n, V, d] where the run takes them and the stream has them (a view method on a single-view
    stream gets it as V = 1), else the stream's [n, d] features (its single view, or the views' confident
    means); for a method that adapts the image encoder, the stream's images (`ImageSide.images`)."""
    if method_card(config["method"]).image_encoder is not None:
        if vision is None:
            raise ValueError(f"{config['method']}: adapts CLIP's image encoder, so its run needs the stream's images "
                             f"and the vision tower (a real dataset and its backbone)")
        return vision.images
    kind = _feature_kind(config, stream)
    return {"views": stream.view_features, "one view": stream.features[:, None]}.get(kind, stream.features)


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
            _mark_failed(writer, exc)
    return _error_text(exc)


def _batch_size(config: dict[str, Any]) -> int:
    return config.get("batch_size", 1)


def part_rows_for(part_rows: int, batch_size: int) -> int:
    """A run's part size: `part_rows` rounded down to a multiple of its batch size (at least one batch), so parts,
    the chunks the method is fed and a resume's restart point never split a batch."""
    return max(1, part_rows // batch_size) * batch_size


def _prompt_text(configs: list[dict[str, Any]], source: DataSource, stream: Stream) -> Any:
    """The text tower and class prompts for the runs whose method runs CLIP's text encoder at test time (the
    source's backbone, loaded once per process), else None. Synthetic sources have no text tower: the sweep's
    checks refuse such runs before they start."""
    if all(method_card(c["method"]).text_encoder is None for c in configs):
        return None
    from orchestrator.clip.backbone import BackboneSpec, shared_backbone
    from orchestrator.clip.prompts import prompt_text

    # The arguments the feature cache loads it with, so that a process that just encoded holds it already.
    backbone = shared_backbone(BackboneSpec(source.model, source.weights, source.quick_gelu), None,
                               weights_dir=None, allow_download=False)
    return prompt_text(backbone, stream.class_names)


@dataclass(frozen=True)
class ImageSide:
    """What a run whose method adapts CLIP's image encoder takes instead of features: the backbone's vision tower
    (the method adapts its own copy) and the stream's images (`StreamImages`, decoded in stream order on demand)."""

    tower: torch.nn.Module
    images: Any


def _image_side(configs: list[dict[str, Any]], source: DataSource, stream: Stream, settings: Settings
                ) -> ImageSide | None:
    """The vision tower and the stream's images for the runs whose method adapts CLIP's image encoder (the source's
    backbone, loaded once per process, as `_prompt_text` loads it), else None. Their images take the backbone's eval
    transform (the 'single' view): the encoder methods here take one image a sample."""
    if all(method_card(c["method"]).image_encoder is None for c in configs):
        return None
    from orchestrator.clip.backbone import BackboneSpec, shared_backbone
    from orchestrator.clip.views import ViewTransform, parse_views
    from orchestrator.features.images import StreamImages

    backbone = shared_backbone(BackboneSpec(source.model, source.weights, source.quick_gelu), None,
                               weights_dir=None, allow_download=False)
    transform = ViewTransform(parse_views("single"), backbone.preprocess, backbone.resolved.preprocess)
    images = StreamImages(stream.image_ids, settings.data_root, transform, stream.class_embeddings.device)
    return ImageSide(backbone.model.visual, images)


def _method_for(config: dict[str, Any], stream: Stream, text: Any, vision: ImageSide | None = None) -> Any:
    """A fresh method for the run's config over this stream (its batch size; the text tower where it runs one; the
    vision tower where it adapts the image encoder)."""
    tower = vision.tower if vision is not None and method_card(config["method"]).image_encoder else None
    return make_method(config["method"], stream.class_embeddings, stream.class_ids, stream.num_classes,
                       batch_size=_batch_size(config), text=text, vision=tower, **_method_hparams(config, len(stream)))


def _method_hparams(config: dict[str, Any], n: int) -> dict[str, Any]:
    """The run's hparams as the method takes them: a null stream-length hparam (its card says which) is the
    stream's length, since the trial feeds the stream in parts."""
    hparams = dict(config["hparams"])
    length = method_card(config["method"]).stream_length
    if length is not None and hparams.get(length) is None:
        hparams[length] = n
    return hparams


# Method code paths already run in this process (JIT-compiled, lazily initialised); see `warm_up`.
_WARM: set[tuple] = set()
# Rows above which a pack writes parts (and is compacted later) rather than committing one segment from memory.
COMMIT_ROWS = 2_000_000
# Samples a warm-up call runs: enough to take every code path's first call, few enough to cost nothing.
WARMUP_SAMPLES = 4


def _code_path(config: dict[str, Any], features: torch.Tensor) -> tuple:
    """What decides which compiled code a run calls: its method, device, feature layout and its non-numeric
    hparams (update rule, selection, dtype); numeric values run the same code."""
    words = tuple(sorted((k, v) for k, v in config["hparams"].items() if isinstance(v, str)))
    return config["method"], str(features.device), features.dim(), words


def warm_up(keys: list[tuple], call: Callable[[], Any]) -> float:
    """Seconds of `call` (the runs' code over a few samples, on throwaway state) if any of `keys` has not run in
    this process yet, else 0: the first trial of a reused actor pays numba's compilation and torch's lazy
    initialisation there, measured apart, so no run's samples/s or stage times count it."""
    if all(key in _WARM for key in keys):
        return 0.0
    began = time.perf_counter()
    call()
    _WARM.update(keys)
    return time.perf_counter() - began


def execute_run(run: Run, stream: Stream, settings: Settings, *, encode_s: float = 0.0,
                peak: PeakMemory | None = None, progress: Progress = _silent, text: Any = None,
                vision: ImageSide | None = None) -> dict[str, Any]:
    """One online run over the stream, a part at a time (the method keeps its state between calls), so rows
    reach the disk while the run goes on. A method that adapts the image encoder saves its state with each part
    (`STATE_ROWS`), and a resumed run goes on from there instead of replaying the stream."""
    writer = RunWriter(settings.results_dir, run.config)
    writer.mark("running", n_samples=len(stream))
    try:
        config = run.config

        def method_for_stream() -> Any:
            return _method_for(config, stream, text, vision)

        features = _features_for(config, stream, vision)
        warmup_s = warm_up([_code_path(config, features)],
                           lambda: method_for_stream().run(features[:WARMUP_SAMPLES]))
        part = part_rows_for(settings.part_rows, _batch_size(config))
        sink = _RowSink(writer, stream, part, settings.failpoint)
        outcome = _Outcome()
        checkpointed = method_card(config["method"]).image_encoder is not None
        with MethodCost(features.device) as whole:  # the method's memory: its state and each part's temporaries
            method = method_for_stream()
            first = _resume_state(writer, method, sink.done) if checkpointed else 0
            for start in range(first, len(stream), part):
                began = time.perf_counter()
                trace = method.run(features[start:start + part])
                labels = stream.labels[start:start + part]
                rows = outcome.add(trace, labels, time.perf_counter() - began)
                if checkpointed:  # the state first: a part on disk always has its state saved (a kill between the
                    # two leaves a state ahead of the rows, which a resume does not take: it replays from the start)
                    outcome.state[STATE_ROWS] = np.array(min(start + part, len(stream)))
                    _save_state(writer, outcome, stream)
                sink.offer(start, rows)
                progress("adapting", min(start + part, len(stream)), len(stream))
        outcome.mem_mb = whole.mb
        if first:  # the rows before `first` are on disk from before: the metrics are the whole run's, read back
            outcome.rows = rows_on_disk(writer)
        return _finish(run, writer, sink.resumed_from, outcome, stream, encode_s, _peak_mb(peak), warmup_s)
    except BaseException as exc:
        _mark_failed(writer, exc)
        raise


def pack_traces(runs: list[Run], stream: Stream, text: Any = None, orders: torch.Tensor | None = None
                ) -> tuple[list[Any], float, list[Cost]]:
    """Each run's trace over the stream from one pass of the multi-config engine per method and kind of features
    the runs take (views, a view axis over single features, or features; exact per run), the warm-up's seconds
    and each run's cost: its share of its method's pass (`MethodCost`'s seconds and memory over the configurations
    of the pass), so a pack of several methods gives each its own. Methods that step in one lockstep runner
    (the BCA family on views, TDA and TDA+PA, the episodic methods) share its pass and its cost, as they share
    its work. `orders` [runs, n]: run i's stream is the stream's samples in the order orders[i]
    (orchestrator.sweep.orders)."""
    from orchestrator.methods.many import run_traces_many

    def shared_pass(config: dict[str, Any]) -> tuple:
        runner = method_card(config["method"]).lockstep_runner(_features_for(config, stream).dim() == 3)
        return _feature_kind(config, stream), ("runner", id(runner)) if runner is not None else config["method"]

    traces: list[Any] = [None] * len(runs)
    costs: list[Cost] = [Cost(0.0, None)] * len(runs)
    passes = []
    kinds = [shared_pass(run.config) for run in runs]
    for kind in dict.fromkeys(kinds):
        picked = [i for i, k in enumerate(kinds) if k == kind]
        configs = [{"method": runs[i].config["method"], "batch_size": _batch_size(runs[i].config),
                    **_method_hparams(runs[i].config, len(stream))} for i in picked]
        passes.append((picked, configs, _features_for(runs[picked[0]].config, stream)))

    def run_pass(configs: list[dict], features: torch.Tensor, order: torch.Tensor | None = None) -> list[Any]:
        return run_traces_many(features, stream.class_embeddings, stream.class_ids, stream.num_classes, configs,
                               text, order)

    warmup_s = warm_up([("pack", *_code_path(runs[i].config, f)) for picked, _, f in passes for i in picked],
                       lambda: [run_pass(c, f[:WARMUP_SAMPLES]) for _, c, f in passes])
    for picked, configs, features in passes:
        with MethodCost(features.device) as cost:
            done = run_pass(configs, features, None if orders is None else orders[picked])
        for i, trace in zip(picked, done):
            traces[i], costs[i] = trace, Cost(cost.seconds / len(picked), cost.mb / len(picked))
    return traces, warmup_s, costs


# The state file's entry saying after how many rows of the stream its state was taken (an encoder method's run).
STATE_ROWS = "state_rows"
# The run's columns its metrics are computed from.
METRIC_COLUMNS = ("pred", "confidence", "top5", "prob_true")


def _resume_state(writer: RunWriter, method: Any, rows_done: int) -> int:
    """Where a run whose state file holds its method's state after `state_rows` rows goes on: there, with that
    state loaded, when those rows are all on disk; else 0 (the stream from its start, fresh)."""
    from orchestrator.results.writer import load_state

    try:
        state = load_state(writer.results_dir, writer.run_id)
    except FileNotFoundError:
        return 0
    rows = int(state.get(STATE_ROWS, 0))
    if not 0 < rows <= rows_done:
        return 0
    method.load_state_tensors(state)
    return rows


def rows_on_disk(writer: RunWriter) -> list[dict[str, np.ndarray]]:
    """The run's written rows (the columns its metrics are computed from), as `_Outcome.rows` holds them."""
    table = writer.read_columns(list(METRIC_COLUMNS))
    return [{"pred": table.column("pred").to_numpy(),
             "confidence": table.column("confidence").to_numpy(),
             "top5": table.column("top5").combine_chunks().flatten().to_numpy().reshape(len(table), -1),
             "prob_true": table.column("prob_true").to_numpy(zero_copy_only=False)}]


def mark_unfinished_failed(writers: list[RunWriter], exc: BaseException) -> None:
    for writer in writers:
        if writer.status() != "finished":
            _mark_failed(writer, exc)


Made = Callable[[int], tuple["_Outcome", dict[str, np.ndarray], Stream]]


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
                _save_state(writer, outcome, stream)
                metrics = _finished_metrics(outcome, stream, encode_s if i == 0 else 0.0, peak_mb,
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
            sink = _RowSink(writer, stream, part_rows_for(settings.part_rows, _batch_size(run.config)),
                            settings.failpoint)
            sink.offer(0, rows)
            _save_state(writer, outcome, stream)
            done.append((run, writer, sink.resumed_from, outcome, stream))
        if batch is not None:
            batch.barrier()
        return [_mark_finished(run, writer, resumed_from, outcome, stream, encode_s if i == 0 else 0.0, peak_mb,
                               warmup_s if i == 0 else 0.0)
                for i, (run, writer, resumed_from, outcome, stream) in enumerate(done)]


def execute_pack(runs: list[Run], stream: Stream, settings: Settings, *, encode_s: float = 0.0,
                 peak: PeakMemory | None = None, text: Any = None) -> list[dict]:
    """Several runs over one stream in one pass of the multi-config engine (exact per run), then the runs
    written by `write_pack` (one segment for fresh runs, else parts from each run's rows_done). A run's
    samples/s is the stream length over its share of its method's pass (`pack_traces`)."""
    started_at = dt.datetime.now(dt.timezone.utc)
    writers, direct = start_pack(runs, len(stream), settings)
    try:
        traces, warmup_s, costs = pack_traces(runs, stream, text)

        def made(i: int) -> tuple[_Outcome, dict[str, np.ndarray], Stream]:
            outcome = _Outcome()
            outcome.mem_mb = costs[i].mem_mb
            return outcome, outcome.add(traces[i], stream.labels, costs[i].seconds), stream

        return write_pack(runs, writers, made, settings, direct=direct, started_at=started_at, encode_s=encode_s,
                          peak_mb=_peak_mb(peak), warmup_s=warmup_s)
    except BaseException as exc:
        mark_unfinished_failed(writers, exc)
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


def execute_trial(trial: Trial, settings: Settings, progress: Progress = _silent) -> list[dict[str, Any]]:
    """Run every run of a trial that is not complete yet (a finished run whose rows went missing is run again
    from its last complete part); returns one metrics dict per run executed. `progress` hears how far encoding
    and (for a single run) adapting got; the runs' rows record it too."""
    todo = [run for run in trial.runs if not RunWriter(settings.results_dir, run.config).complete()]
    if not todo:
        return []
    progress = _RecordProgress(todo, settings, progress)
    load_plugins(settings.plugins)
    keep_views = any(_wants_views(run.config) for run in todo)
    with PeakMemory(auto_device()) as peak:  # this trial's own, not the reused actor process's
        if any(run.source != trial.source for run in todo):  # several orders of one data source
            from orchestrator.sweep.orders import execute_orders

            return execute_orders(todo, settings, peak=peak, progress=progress)
        stream, cached = load_stream(trial.source, settings, keep_views, progress)
        encode_s = 0.0 if cached else stream.encode_s
        text = _prompt_text([run.config for run in todo], trial.source, stream)
        vision = _image_side([run.config for run in todo], trial.source, stream, settings)
        if trial.shard is not None:
            from orchestrator.sweep.shard import execute_shard

            return [execute_shard(todo[0], trial.shard, stream, settings, encode_s=encode_s, peak=peak,
                                  progress=progress, text=text, vision=vision)]
        if len(todo) > 1:
            if vision is not None:  # the plan gives such a run a trial of its own (`plan._make_trials`)
                raise ValueError("a pack holds a run whose method adapts the image encoder; such runs are not packed")
            return execute_pack(todo, stream, settings, encode_s=encode_s, peak=peak, text=text)
        return [execute_run(todo[0], stream, settings, encode_s=encode_s, peak=peak, progress=progress, text=text,
                            vision=vision)]
