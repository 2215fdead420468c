"""What every adaptation method shares: the Trace it returns, input and hparam validation, the registry.

A method is a pure tensor state machine over embeddings: no I/O, no Ray, no paths. Inputs are validated
once at the edge (`make_method`, `Method.run`, `run_stream`); the math below the edge trusts its inputs.
Inputs are expected to be L2-normalised, but norms are not enforced: an AugMix feature is the mean of the
kept views' unit features and is deliberately not renormalised (REFERENCE.md section 3).
"""

from __future__ import annotations

import math
import numbers
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator

import torch

TIMING_KEYS = ("logits", "posterior", "update")


@dataclass
class Trace:
    """One run of a method over a stream chunk, in stream order.

    posteriors: [n, K] float32, rows sum to 1; the prediction is the row's argmax.
    selected: [n] int64, the class-embedding row chosen for adaptation (-1 where the method selects none).
    gated: [n] bool, the likelihood / cache update fired for this sample.
    gated_prior: [n] bool, the prior update fired for this sample.
    state: the method's state after the run ('U' [M, d], 'V' [M, K], 'C1' [M], 'C2' [M] where they apply).
    timings: seconds spent per stage ('logits', 'posterior', 'update'); a best-effort split (no device sync).
    """

    posteriors: torch.Tensor
    selected: torch.Tensor
    gated: torch.Tensor
    gated_prior: torch.Tensor
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TIMING_KEYS, 0.0))

    @property
    def predictions(self) -> torch.Tensor:
        return self.posteriors.argmax(dim=1)

    @property
    def confidences(self) -> torch.Tensor:
        return self.posteriors.max(dim=1).values


class StageTimer:
    """Accumulates wall time per stage; `with timer('logits'): ...`."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(TIMING_KEYS, 0.0)

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


# ----------------------------------------------------------------------------------------------- hparams

def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_real(method: str, name: str, value: Any, *, low: float, low_inclusive: bool = True,
               high: float = math.inf, high_inclusive: bool = True, allow_inf: bool = False,
               hint: str = "") -> float:
    """Return `value` as float if it is a real number in the given range, else raise a ValueError naming it."""
    lo = "[" if low_inclusive else "("
    hi = "]" if high_inclusive else ")"
    expected = f"a number in {lo}{low}, {high}{hi}"
    if not _is_real(value) or math.isnan(float(value)) or (math.isinf(float(value)) and not allow_inf):
        raise ValueError(f"{method}: hparam {name!r} must be {expected}{hint}, got {value!r}")
    v = float(value)
    if v < low or (v == low and not low_inclusive) or v > high or (v == high and not high_inclusive):
        raise ValueError(f"{method}: hparam {name!r} must be {expected}{hint}, got {value!r}")
    return v


def check_int(method: str, name: str, value: Any, *, low: int) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or int(value) < low:
        raise ValueError(f"{method}: hparam {name!r} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_choice(method: str, name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{method}: hparam {name!r} must be one of {list(choices)}, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------- registry

class Method(ABC):
    """Base of every method. Subclasses set `name`, `hparams` (every valid hparam with its default),
    `takes_views` (features must be [n, V, d], view 0 the original), or `accepts_views` (features [n, d], or
    [n, V, d] used as the method's official code uses augmented views), and implement `check_hparams` and
    `_run`.

    A method object is an online state machine: each `run(features)` continues from the state the previous
    call left, so running a stream in two chunks equals running it at once.
    """

    name: ClassVar[str]
    hparams: ClassVar[dict[str, Any]]
    takes_views: ClassVar[bool] = False
    accepts_views: ClassVar[bool] = False

    def __init__(self, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                 **hparams: Any) -> None:
        self.class_embeddings = class_embeddings
        self.class_ids = class_ids
        self.num_classes = num_classes
        self.hp = hparams

    @classmethod
    @abstractmethod
    def check_hparams(cls, hp: dict[str, Any], num_embeddings: int, num_classes: int) -> dict[str, Any]:
        """Validate a complete hparam dict (defaults filled) and return it with normalised values."""

    @abstractmethod
    def _run(self, features: torch.Tensor) -> Trace:
        """Process validated features in stream order, continuing from the current state."""

    @classmethod
    def wants_views(cls, hp: dict[str, Any]) -> bool:
        """Whether a run with these hparams (unset ones take their defaults) should be given a stream's
        augmented views [n, V, d] rather than their confident-view means [n, d] (the trial's hand-off)."""
        return cls.takes_views or cls.accepts_views

    def run(self, features: torch.Tensor) -> Trace:
        """Process `features` ([n, d], or [n, V, d] for view methods) in stream order."""
        validate_features(self.name, features, self.class_embeddings,
                          views=True if self.takes_views else None if self.accepts_views else False)
        return self._run(features)


METHODS: dict[str, type[Method]] = {}


def register(cls: type[Method]) -> type[Method]:
    METHODS[cls.name] = cls
    return cls


def method_class(method: Any) -> type[Method]:
    if not isinstance(method, str) or method not in METHODS:
        raise ValueError(f"unknown method {method!r}; valid methods: {sorted(METHODS)}")
    return METHODS[method]


def hparam_defaults(method: str) -> dict[str, Any]:
    """Every valid hparam of `method` with its default (None where the default is derived, e.g. tau_prior)."""
    return dict(method_class(method).hparams)


def resolve_hparams(method: str, hparams: dict[str, Any]) -> dict[str, Any]:
    """Defaults overlaid by `hparams`; an unknown name raises a ValueError listing the valid ones."""
    defaults = hparam_defaults(method)
    unknown = sorted(set(hparams) - set(defaults))
    if unknown:
        raise ValueError(f"unknown hparam {unknown[0]!r} for method {method!r}; valid hparams: {sorted(defaults)}")
    return {**defaults, **hparams}


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
           False: ("[n, d]", (2,), "; reduce multi-view features first (orchestrator.clip select_views) or take view 0"),
           None: ("[n, d] or [n, V, d] (augmented views, view 0 the original)", (2, 3), "")}


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
    if not bool(torch.isfinite(features).all()):
        bad = int(torch.nonzero(~torch.isfinite(features).flatten(1).all(dim=1))[0])
        raise ValueError(f"{method}: features contain non-finite values (nan or inf), first at sample {bad}")
    zero_norm = torch.linalg.vector_norm(features, dim=-1) == 0
    if views:
        zero_norm = zero_norm.any(dim=1)
    if bool(zero_norm.any()):
        bad = int(torch.nonzero(zero_norm)[0])
        raise ValueError(f"{method}: feature of sample {bad} has zero norm (features are expected L2-normalised)")


# ----------------------------------------------------------------------------------------------- the edge

def make_method(method: str, class_embeddings: torch.Tensor, class_ids: torch.Tensor, num_classes: int,
                **hparams: Any) -> Method:
    """Validate everything but the features and build the method's initial state."""
    cls = method_class(method)
    resolved = resolve_hparams(method, hparams)
    validate_class_inputs(class_embeddings, class_ids, num_classes)
    checked = cls.check_hparams(resolved, class_embeddings.shape[0], int(num_classes))
    return cls(class_embeddings, class_ids, int(num_classes), **checked)


def run_stream(method: str, features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
               num_classes: int, **hparams: Any) -> torch.Tensor:
    """Each sample's posterior [n, K] (float32, rows sum to 1) in stream order; the prediction is its argmax."""
    return make_method(method, class_embeddings, class_ids, num_classes, **hparams).run(features).posteriors
