"""The pieces a trial's ways of running share (`trial`, `pack`, `orders`, `shard` import them as peers): its
settings, its data source's stream, the row sink that writes a run's parts, a run's outcome and how it is
finished, the features, text and image sides a method takes, warm-up, and fault injection.

Streams are memoised per process, keyed by the DataSource (backbone, dataset, views, templates, seed): with
`reuse_actors=True` a Tune actor runs trial after trial, and every trial after the first on the same source
skips loading. Real datasets come through the feature cache (`load_benchmark`), which encodes each cache key
once across all processes (file lock), so at most the first trial of a source pays for the encoder.

Fault injection (the reliability tests): BCA_SWEEP_FAILPOINT="<action>:<parts>:<flag file>" in the driver's
environment (the runner forwards it to every trial through Settings, so it reaches workers of a running
cluster too) makes the first trial that has written <parts> parts of one run, with <flag file> absent, create
the flag and then `sigkill` its own process, `raise` an error, or `stall` (sleep) until killed.
"""

from __future__ import annotations

import dataclasses
import functools
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
from orchestrator.methods.hparams import CLIP_LOGIT_SCALE
from orchestrator.methods.realtime import RealtimeMethod
from orchestrator.registry import ensure_dataset, method_card
from orchestrator.registry.backbones import TEACHER, names_teacher
from orchestrator.results.metrics import TOP_K, run_metrics, stored_run_metrics
from orchestrator.results.schema import RunConfig
from orchestrator.results.writer import RunWriter
from orchestrator.sweep.memory import PeakMemory
from orchestrator.stages import ENCODER_STAGE, METHOD_STAGES, stage_column
from orchestrator.sweep.plan import DataSource, Run, teacher_source
from orchestrator.sweep.spec import SweepSpec

FAILPOINT_ENV = "BCA_SWEEP_FAILPOINT"
# Streams kept per process: one source is all a trial needs; a second spares reloading when trials of two
# sources interleave on one actor. ImageNet with AugMix views is gigabytes, so no more than that.
_MEMO_SIZE = 2
MEMO: OrderedDict[tuple[DataSource, bool], Stream] = OrderedDict()
# What a trial says about itself while it runs: (stage, done, total) with stage 'encoding' (images),
# TEXT_STAGE (prompts) or 'adapting' (samples). The runner forwards it to the driver's progress lines.
Progress = Callable[[str, int, int], None]
TEXT_STAGE = "encoding prompts"


def silent(stage: str, done: int, total: int) -> None:
    return None


@functools.cache
def trial_device() -> torch.device:
    """The device this process's trials run on, normalised once here (the trial's edge): the stream, the
    backbones it loads and its memory measure all take it as it is (a trial process's GPU is not the driver's,
    so it is not part of the `Settings`)."""
    return auto_device()


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
    auxiliary: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)  # name -> [n, d'] (Benchmark's)

    def __len__(self) -> int:
        return int(self.labels.shape[0])


def _benchmark(source: DataSource, dataset: str, settings: Settings, reduce_views: bool,
               progress: Progress) -> Benchmark:
    """One dataset of a source as a Benchmark in dataset order: generated, or read through the feature cache."""
    wanted = json.loads(source.auxiliary) if source.auxiliary else []
    if source.is_synthetic:
        from orchestrator.data.synthetic import auxiliary_features, synthesize

        bench = synthesize(source.synthetic, seed=source.seed, **source.params())
        if not wanted:
            return bench
        feats = auxiliary_features(bench, source.seed)
        return dataclasses.replace(bench, auxiliary={a["name"]: feats for a in wanted})
    from orchestrator.clip.auxiliary import AuxiliarySpec
    from orchestrator.features import load_benchmark

    ensure_dataset(dataset, settings.data_root)  # a folder dataset is registered in each trial process too
    if source.model_config is not None:
        from orchestrator.sweep.catalog import register_model_config

        register_model_config(source.model_config)
    return load_benchmark(dataset, data_root=settings.data_root, cache_dir=settings.cache_dir, device=trial_device(),
                          backbone=source.model,
                          pretrained=source.weights, views=source.views, templates=source.templates,
                          seed=source.seed, quick_gelu=source.quick_gelu, reduce_views=reduce_views,
                          logit_scale=selection_scale(source),
                          auxiliary=tuple(AuxiliarySpec(a["name"], a["arch"], a["checkpoint"]) for a in wanted),
                          context=source_context(source),
                          progress=lambda done, total: progress("encoding", done, total),
                          text_progress=lambda done, total: progress(TEXT_STAGE, done, total))


def source_context(source: DataSource) -> Any:
    """The learned context a source's class prompts (CoOp's) or both towers (MaPLe's) read (None: none), as planned:
    a file changed since is refused, so that a run never records one file's hash beside another's features."""
    if source.context is None:
        return None
    from orchestrator.clip.context import load_learned

    context = load_learned(source.context)
    if context.sha256 != source.context_sha256:
        raise ValueError(f"context file {source.context} changed since the sweep was planned (sha256 "
                         f"{context.sha256[:16]}, planned {str(source.context_sha256)[:16]}); expected the file the "
                         f"run's config names")
    return context


def selection_scale(source: DataSource) -> float:
    """The softmax scale of the data protocol's confident-view selection: CLIP's 100, as the official loaders
    write it, or on a sigmoid-scored backbone (SigLIP) its learned scale (the 'backbone_scale' rule of
    `orchestrator.registry.card.SIGMOID_RULES`)."""
    if source.is_synthetic:
        return CLIP_LOGIT_SCALE
    from orchestrator.sweep.catalog import sigmoid_logits

    logits = sigmoid_logits(source.model, source.pretrained, source.checkpoint)
    return CLIP_LOGIT_SCALE if logits is None else logits[0]


def load_benchmarks(source: DataSource, settings: Settings, reduce_views: bool,
                    progress: Progress = silent) -> tuple[Benchmark, ...]:
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
    device = trial_device()
    features = arranged.features.to(device)
    class_embeddings = arranged.class_embeddings.to(device)
    class_ids = arranged.class_ids.to(device)
    num_classes = len(arranged.class_names)
    view_features = None
    if features.ndim == 3:
        from orchestrator.clip import select_views

        view_features = features
        features = select_views(view_features, class_embeddings, class_ids, num_classes,
                                logit_scale=selection_scale(source))
        if not keep_views:
            view_features = None
    return Stream(features=features, view_features=view_features, labels=arranged.labels,
                  image_ids=arranged.image_ids, order=arranged.order, source_index=arranged.source_index,
                  is_ood=arranged.is_ood, sources=arranged.sources, class_embeddings=class_embeddings,
                  class_ids=class_ids, num_classes=num_classes, class_names=list(arranged.class_names),
                  encode_s=encode_s, skipped=skipped,
                  fingerprint=listing[:16] or None,
                  auxiliary={name: feats.to(device) for name, feats in _arranged_auxiliary(benches, arranged).items()})


def _arranged_auxiliary(benches: tuple[Benchmark, ...], arranged: Any) -> dict[str, torch.Tensor]:
    """The benchmarks' auxiliary features in the arranged stream's order, each sample found by its dataset and
    image id (every protocol keeps both, whatever subsets it drew)."""
    names = list(benches[0].auxiliary)
    if not names:
        return {}
    rows = {(b.name, image_id): (s, i) for s, b in enumerate(benches) for i, image_id in enumerate(b.image_ids)}
    at = [rows[(dataset, image_id)] for dataset, image_id in zip(arranged.sources, arranged.image_ids)]
    out = {}
    for name in names:
        feats = torch.empty(len(at), benches[0].auxiliary[name].shape[1], dtype=torch.float32)
        for s, bench in enumerate(benches):
            mine = [(k, i) for k, (t, i) in enumerate(at) if t == s]
            if mine:
                feats[[k for k, _ in mine]] = bench.auxiliary[name][[i for _, i in mine]]
        out[name] = feats
    return out


def load_stream(source: DataSource, settings: Settings, keep_views: bool = False,
                progress: Progress = silent) -> tuple[Stream, bool]:
    """(stream, was it already in this process's memo). `keep_views`: also hold every AugMix view (for runs
    that take views: zero, tda, tda_pa, the BCA family's view_selection='adaptive');
    otherwise only the confident-view means are built, without a float32 copy of all views."""
    key = (source, keep_views)
    if key in MEMO:
        MEMO.move_to_end(key)
        return MEMO[key], True
    benches = load_benchmarks(source, settings, reduces_views(source, keep_views), progress)
    return remember_stream(source, keep_views, stream_from(source, benches, keep_views)), False


def remember_stream(source: DataSource, keep_views: bool, stream: Stream) -> Stream:
    """Keep a built stream in this process's memo (the next trials of its source skip loading)."""
    MEMO[(source, keep_views)] = stream
    while len(MEMO) > _MEMO_SIZE:
        MEMO.popitem(last=False)
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


def fire_failpoint(spec: str | None, parts_written: int) -> None:
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

class RowSink:
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
            fire_failpoint(self.failpoint, self.parts)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def mark_failed(writer: RunWriter, exc: BaseException) -> None:
    """Record why a run stopped (KeyboardInterrupt included); never let the recording hide the cause."""
    try:
        writer.mark("failed", error=error_text(exc))
    except Exception:  # noqa: BLE001 - e.g. the results dir became unwritable: the original error matters more
        pass


def trace_rows(trace: Any, labels: torch.Tensor) -> dict[str, np.ndarray]:
    """The per-sample columns a trace gives: prediction, confidence, top-5 classes, the true class's probability
    (NaN for an OOD sample, label -1), and the method's gate and selection."""
    post = trace.posteriors
    # A stable sort, not topk: among tied posteriors (a uniform row) topk's pick is unspecified, and the stored
    # prediction must be the trace's argmax (the first maximum) that every reference and the official codes take.
    ranked = torch.sort(post, dim=1, descending=True, stable=True)
    values, classes = ranked.values[:, :TOP_K], ranked.indices[:, :TOP_K]
    labels = labels.to(post.device)
    prob_true = post.gather(1, labels.clamp_min(0)[:, None])[:, 0].masked_fill(labels < 0, float("nan"))
    return {"pred": to_numpy(classes[:, 0]), "confidence": to_numpy(values[:, 0]), "top5": to_numpy(classes),
            "prob_true": to_numpy(prob_true), "gated": to_numpy(trace.gated),
            "gated_prior": to_numpy(trace.gated_prior), "selected": to_numpy(trace.selected)}


@dataclass(frozen=True)
class Cost:
    """A run's share of its method's pass: seconds, and peak memory in MiB (None where not measured)."""

    seconds: float
    mem_mb: float | None


class Outcome:
    """A run's per-sample outputs over the whole stream and its timings, ready to finish."""

    def __init__(self) -> None:
        self.rows: list[dict[str, np.ndarray]] = []
        self.timings: dict[str, float] = {}
        self.run_s = 0.0
        self.computed = 0  # samples the method ran in run_s (a replayed prefix included)
        self.state: dict[str, np.ndarray] = {}
        self.mem_mb: float | None = None  # the method's own peak memory (MethodCost), its share in a pack

    def add(self, trace: Any, labels: torch.Tensor, seconds: float) -> dict[str, np.ndarray]:
        self.state = {k: to_numpy(v) for k, v in trace.state.items()}
        return self.add_rows(trace_rows(trace, labels), seconds, trace.timings)

    def add_rows(self, rows: dict[str, np.ndarray], seconds: float, timings: dict[str, float]
                 ) -> dict[str, np.ndarray]:
        """Per-sample rows (`trace_rows`) that took `seconds`, split into `timings` by stage."""
        self.run_s += seconds
        self.computed += len(rows["pred"])
        for stage, t in timings.items():
            self.timings[stage] = self.timings.get(stage, 0.0) + t
        self.rows.append(rows)
        return rows

    def column(self, name: str) -> np.ndarray:
        return np.concatenate([r[name] for r in self.rows])


def finish(run: Run, writer: RunWriter, resumed_from: int, outcome: Outcome, stream: Stream,
            encode_s: float, peak_mb: float | None, warmup_s: float = 0.0) -> dict[str, Any]:
    """Save the final state and stream order, mark the run finished with its metrics (from the run's rows in
    `outcome`); return them."""
    save_run_state(writer, outcome, stream)
    return mark_finished(run, writer, resumed_from, outcome, stream, encode_s, peak_mb, warmup_s)


def save_run_state(writer: RunWriter, outcome: Outcome, stream: Stream) -> None:
    writer.save_state({**outcome.state, "class_ids": to_numpy(stream.class_ids), "stream_order": to_numpy(stream.order),
                       "stream_source": to_numpy(stream.source_index)})


def mark_finished(run: Run, writer: RunWriter, resumed_from: int, outcome: Outcome, stream: Stream,
                   encode_s: float, peak_mb: float | None, warmup_s: float) -> dict[str, Any]:
    """Mark the run finished with its metrics (from its rows in `outcome`), its rows and state already written;
    return them."""
    metrics = finished_metrics(outcome, stream, encode_s, peak_mb, warmup_s)
    writer.mark("finished", **metrics)
    n = len(stream)
    return {**metrics, "run_id": run.run_id, "rows_written": n - resumed_from, "resumed_from": resumed_from}


def finished_metrics(outcome: Outcome, stream: Stream, encode_s: float, peak_mb: float | None,
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


def peak_mb_of(peak: PeakMemory | None) -> float | None:
    return None if peak is None else peak.mb()


def wants_views(config: RunConfig) -> bool:
    return method_card(config.method).wants_views(config.hparams)


def feature_kind(config: RunConfig, stream: Stream) -> str:
    """What `features_for` hands the run: 'views', 'one view' (a view method on a single-view stream) or
    'features'; the runs of a pack's pass share one kind."""
    if stream.view_features is not None and wants_views(config):
        return "views"
    return "one view" if method_card(config.method).takes_views else "features"


def features_for(config: RunConfig, stream: Stream, vision: ImageSide | None = None) -> Any:
    """The views [n, V, d] where the run takes them and the stream has them (a view method on a single-view
    stream gets it as V = 1), else the stream's [n, d] features (its single view, or the views' confident
    means); for a method that adapts the image encoder, the stream's images (`ImageSide.images`)."""
    if method_card(config.method).image_encoder is not None:
        if vision is None:
            raise ValueError(f"{config.method}: adapts CLIP's image encoder, so its run needs the stream's images "
                             f"and the vision tower (a real dataset and its backbone)")
        return vision.images
    kind = feature_kind(config, stream)
    return {"views": stream.view_features, "one view": stream.features[:, None]}.get(kind, stream.features)



def auxiliary_for(config: RunConfig, stream: Stream, start: int, stop: int) -> dict[str, torch.Tensor] | None:
    """Rows start:stop of the auxiliary features the run's method reads, and of its teacher's where it names one
    (`with_teacher`; the teacher's class features whole); None: it reads none."""
    from orchestrator.methods.prompt import TEACHER_CLASSES, TEACHER_VIEWS

    names = method_card(config.method).auxiliary
    out = {name: stream.auxiliary[name][start:stop] for name in names}
    if names_teacher(method_card(config.method)):
        out.update({TEACHER_VIEWS: stream.auxiliary[TEACHER_VIEWS][start:stop],
                    TEACHER_CLASSES: stream.auxiliary[TEACHER_CLASSES]})
    return out or None


def with_teacher(stream: Stream, configs: list[RunConfig], source: DataSource, settings: Settings,
                 progress: Progress = silent) -> Stream:
    """The stream with its teacher's features beside (`auxiliary_for` hands them to the method) where a run names a
    teacher, else the stream itself. The teacher is frozen, so its features of every view and of its class prompts
    are read through the feature cache (encoded once, shared by every run that reads them) rather than by a second
    model in the trial. A trial holds one such run (the plan never packs them)."""
    from orchestrator.methods.prompt import TEACHER_CLASSES, TEACHER_VIEWS

    teachers = {c.hparams[TEACHER] for c in configs if names_teacher(method_card(c.method))}
    if not teachers:
        return stream
    if len(teachers) > 1:
        raise ValueError(f"a trial holds runs of several teachers {sorted(teachers)}; such runs are not packed")
    teacher, _ = load_stream(teacher_source(source, teachers.pop()), settings, keep_views=True, progress=progress)
    if teacher.image_ids != stream.image_ids or teacher.view_features is None \
            or teacher.view_features.shape[:2] != stream.view_features.shape[:2]:
        raise ValueError(f"the teacher's stream of {source.dataset} does not match the run's (its images or views "
                         f"differ); expected the same images and views for the student and its teacher")
    return dataclasses.replace(stream, auxiliary={**stream.auxiliary, TEACHER_VIEWS: teacher.view_features,
                                                  TEACHER_CLASSES: teacher.class_embeddings})


def part_rows_for(part_rows: int, batch_size: int) -> int:
    """A run's part size: `part_rows` rounded down to a multiple of its batch size (at least one batch), so parts,
    the chunks the method is fed and a resume's restart point never split a batch."""
    return max(1, part_rows // batch_size) * batch_size


class PromptTexts:
    """The text side of the runs of one stream whose method runs CLIP's text encoder at test time: one PromptText
    per learned context (`for_run`: a run's config names its context file, if any; none: the hand-written
    prompt), made once each."""

    def __init__(self, backbone: Any, class_names: list[str]) -> None:
        self.backbone, self.class_names = backbone, class_names
        self._made: dict[str | None, Any] = {}
        self._contexts: dict[str | None, Any] = {}

    def context_for(self, config: RunConfig) -> Any:
        """The learned context a run's config names (`planned_context`; None: none), read once per file: a MaPLe
        checkpoint holds all of CLIP, so a run's text and image sides share one read and one hash of it."""
        path = config.get("context")
        if path not in self._contexts:
            self._contexts[path] = None if path is None else planned_context(config)
        return self._contexts[path]

    def for_run(self, config: RunConfig) -> Any:
        from orchestrator.clip.maple import maple_prompt_text
        from orchestrator.clip.prompts import prompt_text

        path = config.get("context")
        if path not in self._made:
            context = self.context_for(config)
            self._made[path] = (maple_prompt_text(self.backbone, self.class_names, context)
                                if method_card(config.method).tunes_maple
                                else prompt_text(self.backbone, self.class_names, context=context))
        return self._made[path]


def planned_context(config: RunConfig) -> Any:
    """The learned context a run's config names, as planned (a file changed since is refused): CoOp's context, or
    MaPLe's prompts for a method tuning them."""
    from orchestrator.clip.context import load_context, load_maple

    path = config["context"]
    context = load_maple(path) if method_card(config.method).tunes_maple else load_context(path)
    if context.sha256 != config.get("context_sha256"):
        raise ValueError(f"context file {path} changed since the sweep was planned (sha256 {context.sha256[:16]}, "
                         f"planned {str(config.get('context_sha256'))[:16]}); expected the file the run's config names")
    return context


def planned_statistics(config: RunConfig) -> Any:
    """PromptAlign's source statistics a run's config names, as planned (None where it names none)."""
    from orchestrator.clip.context import load_statistics

    if config.get("vis_means") is None:
        return None
    stats = load_statistics(config["vis_means"], config["vis_vars"])
    for field, sha in zip(("vis_means", "vis_vars"), stats.sha256):
        if sha != config.get(f"{field}_sha256"):
            raise ValueError(f"{field} file {config[field]} changed since the sweep was planned (sha256 {sha[:16]}, "
                             f"planned {str(config.get(f'{field}_sha256'))[:16]}); expected the file the run's config "
                             f"names")
    return stats


def prompt_text_for(configs: list[RunConfig], source: DataSource, stream: Stream) -> PromptTexts | None:
    """The text tower and class prompts for the runs whose method runs CLIP's text encoder at test time (the
    source's backbone, loaded once per process), else None. Synthetic sources have no text tower: the sweep's
    checks refuse such runs before they start."""
    if not any(method_card(c.method).takes_text for c in configs):
        return None
    from orchestrator.clip.backbone import BackboneSpec, shared_backbone

    # The arguments the feature cache loads it with, so that a process that just encoded holds it already.
    backbone = shared_backbone(BackboneSpec(source.model, source.weights, source.quick_gelu), trial_device(),
                               weights_dir=None, allow_download=False)
    return PromptTexts(backbone, stream.class_names)


@dataclass(frozen=True)
class ImageSide:
    """What a run whose method adapts CLIP's image encoder takes instead of features: the backbone's vision tower
    (the method adapts its own copy) and the stream's images (`StreamImages`, decoded in stream order on demand)."""

    tower: torch.nn.Module
    images: Any


def image_side(configs: list[RunConfig], source: DataSource, stream: Stream, settings: Settings
                ) -> ImageSide | None:
    """The vision tower and the stream's images for the runs whose method adapts CLIP's image encoder (the source's
    backbone, loaded once per process, as `prompt_text_for` loads it), else None. Their images take the backbone's eval
    transform (the 'single' view), or where the method takes views its source's (PromptAlign's crops)."""
    if all(method_card(c.method).image_encoder is None for c in configs):
        return None
    from orchestrator.clip.backbone import BackboneSpec, shared_backbone
    from orchestrator.clip.views import ViewTransform, parse_views
    from orchestrator.features.images import StreamImages

    backbone = shared_backbone(BackboneSpec(source.model, source.weights, source.quick_gelu), trial_device(),
                               weights_dir=None, allow_download=False)
    # the views the source's cache entry holds, drawn alike (`spec.dataset_views`)
    transform = ViewTransform(parse_views(source.views, source.seed), backbone.preprocess, backbone.resolved.preprocess)
    images = StreamImages(stream.image_ids, settings.data_root, transform, stream.class_embeddings.device)
    return ImageSide(backbone.model.visual, images)


def method_for(config: RunConfig, stream: Stream, text: PromptTexts | None, vision: ImageSide | None = None) -> Any:
    """A fresh method for the run's config over this stream (its batch size; the text tower and its starting
    context where it runs one; the vision tower where it adapts the image encoder); on a realtime stream, adapting
    on every k-th sample only."""
    tower = vision.tower if vision is not None and method_card(config.method).image_encoder else None
    if tower is not None and method_card(config.method).tunes_maple:
        from orchestrator.methods.promptalign.method import AlignVision

        tower = AlignVision(tower, text.context_for(config), planned_statistics(config))
    method = make_method(config.method, stream.class_embeddings, stream.class_ids, stream.num_classes,
                         batch_size=config.batch_size, text=None if text is None else text.for_run(config),
                         vision=tower, **method_hparams(config, len(stream)))
    return method if config.realtime_k is None else RealtimeMethod(method, config.realtime_k)


def method_hparams(config: RunConfig, n: int) -> dict[str, Any]:
    """The run's hparams as the method takes them: a null stream-length hparam (its card says which) is the
    stream's length, since the trial feeds the stream in parts."""
    hparams = dict(config.hparams)
    length = method_card(config.method).stream_length
    if length is not None and hparams.get(length) is None:
        hparams[length] = n
    return hparams


# Method code paths already run in this process (JIT-compiled, lazily initialised); see `warm_up`.
_WARM: set[tuple] = set()
# Samples a warm-up call runs: enough to take every code path's first call, few enough to cost nothing.
WARMUP_SAMPLES = 4


def code_path(config: RunConfig, features: torch.Tensor) -> tuple:
    """What decides which compiled code a run calls: its method, device, feature layout and its non-numeric
    hparams (update rule, selection, dtype); numeric values run the same code."""
    words = tuple(sorted((k, v) for k, v in config.hparams.items() if isinstance(v, str)))
    return config.method, str(features.device), features.dim(), words


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


# The state file's entry saying after how many rows of the stream its state was taken (an encoder method's run).
STATE_ROWS = "state_rows"
# The run's columns its metrics are computed from.
METRIC_COLUMNS = ("pred", "confidence", "top5", "prob_true")


def resume_state(writer: RunWriter, method: Any, rows_done: int) -> int:
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
    """The run's written rows (the columns its metrics are computed from), as `Outcome.rows` holds them."""
    table = writer.read_columns(list(METRIC_COLUMNS))
    return [{"pred": table.column("pred").to_numpy(),
             "confidence": table.column("confidence").to_numpy(),
             "top5": table.column("top5").combine_chunks().flatten().to_numpy().reshape(len(table), -1),
             "prob_true": table.column("prob_true").to_numpy(zero_copy_only=False)}]


def mark_unfinished_failed(writers: list[RunWriter], exc: BaseException) -> None:
    for writer in writers:
        if writer.status() != "finished":
            mark_failed(writer, exc)
