"""What every adaptation method shares: the Trace it returns, input and hparam validation, the registry.

A method is a pure tensor state machine over embeddings: no I/O, no Ray, no paths. Inputs are validated
once at the edge (`make_method`, `Method.run`, `run_stream`); the math below the edge trusts its inputs.
Inputs are expected to be L2-normalised, but norms are not enforced: an AugMix feature is the mean of the
kept views' unit features and is deliberately not renormalised (TDA's public protocol).
"""

from __future__ import annotations

import numbers
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping

import torch

from orchestrator.methods.prototypes import class_prototypes
from orchestrator.registry import MethodCard, method_card
from orchestrator.stages import METHOD_STAGES


@dataclass
class Trace:
    """One run of a method over a stream chunk, in stream order.

    posteriors: [n, K] float32, rows sum to 1; the prediction is the row's argmax.
    selected: [n] int64, the class-embedding row chosen for adaptation (-1 where the method selects none).
    gated: [n] bool, the likelihood / cache update fired for this sample.
    gated_prior: [n] bool, the prior update fired for this sample.
    state: the method's state after the run ('U' [M, d], 'V' [M, K], 'C1' [M], 'C2' [M] where they apply), name
        -> tensor; read-only (a lockstep runner may share a tensor between streams, or form an entry on each
        access: dota/lockstep.py).
    timings: seconds spent per stage ('logits', 'posterior', 'update'); a best-effort split (no device sync).
    """

    posteriors: torch.Tensor
    selected: torch.Tensor
    gated: torch.Tensor
    gated_prior: torch.Tensor
    state: Mapping[str, torch.Tensor] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(METHOD_STAGES, 0.0))

    @property
    def predictions(self) -> torch.Tensor:
        return self.posteriors.argmax(dim=1)

    @property
    def confidences(self) -> torch.Tensor:
        return self.posteriors.max(dim=1).values


class StageTimer:
    """Accumulates wall time per stage; `with timer('logits'): ...`."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(METHOD_STAGES, 0.0)

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] += time.perf_counter() - start


def empty_trace(n: int, num_classes: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Fresh per-sample output buffers: posteriors, selected (-1), gated, gated_prior."""
    return (torch.zeros(n, num_classes, dtype=torch.float32, device=device),
            torch.full((n,), -1, dtype=torch.int64, device=device),
            torch.zeros(n, dtype=torch.bool, device=device),
            torch.zeros(n, dtype=torch.bool, device=device))


# ---------------------------------------------------------------------------------------------- methods

class Method(ABC):
    """Base of every method. Subclasses set `name` (the key of their registry card, which declares their
    hyperparameters, inputs and state: `orchestrator.registry`), and implement `_run`; `check_hparams` adds the
    rules that tie hparams to each other or to the inputs (each value alone was checked against the card).

    A method object is an online state machine: each `run(features)` continues from the state the previous
    call left, so running a stream in two chunks equals running it at once.
    """

    name: ClassVar[str]
    # samples per adaptation step: 1 for a per-sample method; a BatchMethod's is set by `make_method`
    batch_size: int = 1

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        self.class_embeddings = class_embeddings
        self.class_ids = class_ids
        self.num_classes = num_classes
        self.hp = hparams

    @classmethod
    def card(cls) -> MethodCard:
        return method_card(cls.name)

    @classmethod
    def check_hparams(cls, hp: dict[str, Any], num_embeddings: int, num_classes: int) -> dict[str, Any]:
        """Cross-hparam and input-dependent rules over a complete, card-checked hparam dict."""
        return hp

    @abstractmethod
    def _run(self, features: torch.Tensor) -> Trace:
        """Process validated features in stream order, continuing from the current state."""

    def run_steps(self, features: torch.Tensor) -> Trace:
        """For a per-sample method: its `_step(sample, timer) -> (posterior, selected, gated)` over the stream in
        order, gathered into a Trace with `state_tensors()` taken after the loop."""
        n = features.shape[0]
        posteriors, selected, gated, gated_prior = empty_trace(n, self.num_classes, features.device)
        timer = StageTimer()
        for i in range(n):
            posteriors[i], selected[i], gated[i] = self._step(features[i], timer)
        return Trace(posteriors, selected, gated, gated_prior, state=self.state_tensors(), timings=timer.seconds)

    @classmethod
    def offers_frozen(cls) -> bool:
        """Whether it predicts without adapting, which a realtime stream needs: a method that can defines
        `frozen(features) -> posteriors [n, K]`, what its current state gives `features` (validated, as `run` takes
        them), adapting on none of them and leaving its state as it was (`orchestrator.methods.realtime`; the
        sweep's checks refuse a realtime stream for any other method)."""
        return callable(getattr(cls, "frozen", None))

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Copies of the state tensors the trace exposes (its card's `state`)."""
        return {}

    def run(self, features: torch.Tensor, auxiliary: Mapping[str, torch.Tensor] | None = None) -> Trace:
        """Process `features` ([n, d], or [n, V, d] for view methods) in stream order; `auxiliary`: for a method
        whose card reads auxiliary encoders, each one's [n, d'] features of the same samples."""
        card = self.card()
        inputs = card.inputs
        validate_features(self.name, features, self.class_embeddings,
                          views=True if inputs == "views" else None if inputs == "either" else False)
        if not card.auxiliary:
            return self._run(features)
        validate_auxiliary(self.name, card.auxiliary, auxiliary, features.shape[0])
        return self._run(features, {name: auxiliary[name] for name in card.auxiliary})


def concat_traces(traces: list[Trace]) -> Trace:
    """Consecutive traces of one stream as one: rows in order, the last trace's state, timings summed."""
    timings = dict.fromkeys(METHOD_STAGES, 0.0)
    for t in traces:
        for stage, seconds in t.timings.items():
            timings[stage] += seconds
    return Trace(torch.cat([t.posteriors for t in traces]), torch.cat([t.selected for t in traces]),
                 torch.cat([t.gated for t in traces]), torch.cat([t.gated_prior for t in traces]),
                 state=traces[-1].state, timings=timings)


class BatchMethod(Method):
    """A method whose official code adapts on batches (its card's `batch_size` is the official size): the stream is
    cut into batches of `batch_size` consecutive samples and each is handed whole to `_batch`, which applies the
    official rule and order (predict then update, update then predict, or solve the batch on its own). A run's
    last batch may be shorter; a caller that runs a stream in parts keeps the parts at multiples of `batch_size`
    so that the batches are the same as in one run."""

    @abstractmethod
    def _batch(self, features: torch.Tensor) -> Trace:
        """One batch ([b, d] or [b, V, d], 1 <= b <= batch_size): its rows, continuing from the current state."""

    def _run(self, features: torch.Tensor) -> Trace:
        b, n = self.batch_size, features.shape[0]
        if n == 0:  # no batch at all: nothing predicted, the state as it was
            return Trace(*empty_trace(0, self.num_classes, features.device), state=self.state_tensors())
        return concat_traces([self._batch(features[s:s + b]) for s in range(0, n, b)])


class TextBatchMethod(BatchMethod):
    """A batch method with no state across batches: each batch is solved alone from the class text prototypes
    (`solve`), its rows selecting nothing and gating nothing (StatA, TransCLIP, ZLaP)."""

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        super().__init__(class_embeddings, class_ids, num_classes, **hparams)
        self.text = class_prototypes(class_embeddings, class_ids, num_classes)

    @abstractmethod
    def solve(self, features: torch.Tensor, timer: StageTimer) -> torch.Tensor:
        """The batch's posteriors [b, K]."""

    def _batch(self, features: torch.Tensor) -> Trace:
        _, selected, gated, gated_prior = empty_trace(features.shape[0], self.num_classes, features.device)
        timer = StageTimer()
        posteriors = self.solve(features, timer)
        return Trace(posteriors, selected, gated, gated_prior, timings=timer.seconds)


# -------------------------------------------------------------------------------------------- validation

def validate_class_inputs(class_embeddings: Any, class_ids: Any, num_classes: Any) -> None:
    if not isinstance(num_classes, numbers.Integral) or isinstance(num_classes, bool) or num_classes < 2:
        raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if not isinstance(class_embeddings, torch.Tensor):
        raise ValueError(f"class_embeddings must be a torch.Tensor [M, d], got {type(class_embeddings).__name__}")
    if class_embeddings.dtype != torch.float32:
        raise ValueError(f"class_embeddings must be float32, got {class_embeddings.dtype}")
    if class_embeddings.ndim != 2 or class_embeddings.shape[0] < 1 or class_embeddings.shape[1] < 1:
        raise ValueError(f"class_embeddings must have shape [M, d] with M, d >= 1, "
                         f"got {tuple(class_embeddings.shape)}")
    if not bool(torch.isfinite(class_embeddings).all()):
        raise ValueError("class_embeddings contain non-finite values (nan or inf)")
    if not isinstance(class_ids, torch.Tensor):
        raise ValueError(f"class_ids must be a torch.Tensor [M] int64, got {type(class_ids).__name__}")
    if class_ids.dtype != torch.int64:
        raise ValueError(f"class_ids must be int64, got {class_ids.dtype}")
    m = class_embeddings.shape[0]
    if class_ids.shape != (m,):
        raise ValueError(f"class_ids must have shape [M] = [{m}] (one id per class embedding), "
                         f"got {tuple(class_ids.shape)}")
    if class_ids.device != class_embeddings.device:
        raise ValueError(f"class_ids are on {class_ids.device} but class_embeddings on {class_embeddings.device}")
    low, high = int(class_ids.min()), int(class_ids.max())
    if low < 0 or high >= num_classes:
        bad = low if low < 0 else high
        raise ValueError(f"class_ids must lie in [0, num_classes) = [0, {num_classes}), found {bad}")
    counts = torch.bincount(class_ids, minlength=num_classes)
    if bool((counts == 0).any()):
        missing = torch.nonzero(counts == 0).flatten()[:10].tolist()
        raise ValueError(f"every class needs at least one class embedding; classes without one: {missing}")


_SHAPES = {True: ("[n, V, d] (augmented views, view 0 the original)", (3,),
                  "; add a view axis (features[:, None]) for single-view features"),
           False: ("[n, d]", (2,),
                   "; reduce multi-view features first (orchestrator.clip select_views) or take view 0"),
           None: ("[n, d] or [n, V, d] (augmented views, view 0 the original)", (2, 3), "")}


def validate_auxiliary(method: str, names: tuple[str, ...], auxiliary: Mapping[str, torch.Tensor] | None,
                       n: int) -> None:
    """Each auxiliary encoder the card names, as float32 [n, d'] features of the stream's n samples."""
    for name in names:
        feats = (auxiliary or {}).get(name)
        if feats is None:
            raise ValueError(f"{method}: reads the {name} auxiliary encoder's features; none were given (the "
                             f"backbone names its auxiliary encoders under `auxiliary:`)")
        if not isinstance(feats, torch.Tensor) or feats.dtype != torch.float32 or feats.ndim != 2 \
                or feats.shape[0] != n:
            shape = tuple(feats.shape) if isinstance(feats, torch.Tensor) else type(feats).__name__
            raise ValueError(f"{method}: {name} features must be float32 [{n}, d'] (one row a sample), got {shape}")


def validate_features(method: str, features: Any, class_embeddings: torch.Tensor, *, views: bool | None) -> None:
    """views: True for [n, V, d] only, False for [n, d] only, None for either."""
    expected, ndims, hint = _SHAPES[views]
    if not isinstance(features, torch.Tensor):
        raise ValueError(f"{method}: features must be a torch.Tensor {expected}, got {type(features).__name__}")
    if features.dtype != torch.float32:
        raise ValueError(f"{method}: features must be float32, got {features.dtype}")
    if features.ndim not in ndims:
        raise ValueError(f"{method}: features must have shape {expected}, got {tuple(features.shape)}{hint}")
    views = features.ndim == 3
    d = class_embeddings.shape[1]
    if features.shape[-1] != d:
        raise ValueError(f"{method}: features have dimension {features.shape[-1]} but class_embeddings have {d}")
    if views and features.shape[1] < 1:
        raise ValueError(f"{method}: features need at least one view, got shape {tuple(features.shape)}")
    if features.device != class_embeddings.device:
        raise ValueError(f"{method}: features are on {features.device} but class_embeddings on "
                         f"{class_embeddings.device}")
    # One pass over the features: a nan or inf entry makes its vector's norm non-finite.
    norms = torch.linalg.vector_norm(features, dim=-1)
    unusable = ~torch.isfinite(norms)
    if views:
        unusable = unusable.any(dim=1)
    if bool(unusable.any()):
        bad = int(torch.nonzero(unusable)[0])
        if not bool(torch.isfinite(features[bad]).all()):
            raise ValueError(f"{method}: features contain non-finite values (nan or inf), first at sample {bad}")
        raise ValueError(f"{method}: feature of sample {bad} has a norm beyond float32's range "
                         f"(features are expected L2-normalised)")
    zero_norm = norms == 0
    if views:
        zero_norm = zero_norm.any(dim=1)
    if bool(zero_norm.any()):
        bad = int(torch.nonzero(zero_norm)[0])
        raise ValueError(f"{method}: feature of sample {bad} has zero norm (features are expected L2-normalised)")


# ----------------------------------------------------------------------------------------------- the edge

def check_batch_size(method: str, batch_size: Any) -> int:
    """The batch size a method runs at: any integer >= 1 for a BatchMethod, 1 for a per-sample method."""
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"{method}: batch_size must be an integer >= 1, got {batch_size!r}")
    if batch_size != 1 and method_card(method).batch_size is None:
        raise ValueError(f"{method}: batch_size must be 1 (the method adapts per sample; its official code has no "
                         f"batch rule), got {batch_size}")
    return int(batch_size)


def make_method(method: str, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                batch_size: int = 1, text: Any = None, vision: Any = None, **hparams: Any) -> Method:
    """Validate everything but the features and build the method's initial state (hparams not given take the
    card's defaults; per-dataset defaults are the sweep's business: `method_card(m).defaults(dataset)`).
    batch_size: samples per adaptation step (`BatchMethod`; a per-sample method takes 1 only). text: the text
    tower and class prompts (`orchestrator.methods.prompt.PromptText`) of a method whose card has a
    `text_encoder`; vision: the backbone's vision tower (`orchestrator.methods.encoder`) of a method whose card has
    an `image_encoder` (its `run` then takes images); None for every other method."""
    validate_class_inputs(class_embeddings, class_ids, num_classes)
    return build_method(method, class_embeddings, class_ids, num_classes, batch_size, text, vision, **hparams)


def build_method(method: str, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 batch_size: int = 1, text: Any = None, vision: Any = None, **hparams: Any) -> Method:
    """`make_method` for class inputs already validated (`validate_class_inputs`): a pack builds G methods over
    one set of class embeddings and checks it once."""
    card = method_card(method)
    resolved = card.resolve(hparams)
    batch_size = check_batch_size(method, batch_size)
    if not card.takes_text and text is not None:
        raise ValueError(f"{method}: takes no text encoder (text=...); only methods whose card has a text_encoder "
                         f"(or an image_encoder with text_tower) do")
    if card.image_encoder is None and vision is not None:
        raise ValueError(f"{method}: takes no vision tower (vision=...); only methods whose card has an image_encoder "
                         f"do")
    cls = card.implementation()
    checked = cls.check_hparams(resolved, class_embeddings.shape[0], int(num_classes))
    extra = {"text": text} if card.takes_text else {}
    if card.image_encoder is not None:
        extra["vision"] = vision
    built = cls(class_embeddings, class_ids, int(num_classes), **extra, **checked)
    built.batch_size = batch_size
    return built


def run_stream(method: str, features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
               num_classes: int, batch_size: int = 1, text: Any = None, **hparams: Any) -> torch.Tensor:
    """Each sample's posterior [n, K] (float32, rows sum to 1) in stream order; the prediction is its argmax.
    batch_size: a BatchMethod's samples per step (`method_card(m).batch_size` is its official size); text: see
    `make_method`."""
    return make_method(method, class_embeddings, class_ids, num_classes, batch_size=batch_size, text=text,
                       **hparams).run(features).posteriors
