"""The method registry: one card per method, every fact about it in one record that everything else asks.

A card is plain data (no torch): its label and display order, each hyperparameter (type, range, default, doc,
role, per-dataset defaults, when it matters), the inputs it needs (a single feature or augmented views, and
which view kind its official protocol uses), the state it exposes (a prior to draw, caches, ...), and where
its implementation lives (`impl`, "module:Class", imported only when a run needs it). Spec validation, the
results schema's hyperparameter columns, the report's and dashboard's labels, filters and prior view, and the
methods table of docs/methods.md all derive from the cards; `orchestrator.methods` checks hparams through them.

The built-in cards are in `orchestrator.registry.cards`. A plugin declares a card in a module of its own
(its `impl` may be the class itself) and calls `register_method(card)`; a sweep spec names such modules under
`plugins:` and `BCA_PLUGINS` (comma-separated module names) loads them in any process, the dashboard's included.
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from orchestrator.registry.datasets import canonical_dataset, dataset_card, dataset_key

KINDS = ("float", "int", "str", "bool")
ROLES = ("threshold", "count", "rate", "weight", "scale", "size", "choice", "flag", "seed")
INPUTS = ("single", "views", "either")
VIEW_KINDS = ("augmix", "crops")
_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class HParam:
    """One hyperparameter of a method.

    kind: float | int | str | bool; default: its value (None only with `nullable`); low / high: inclusive
    bounds unless low_open / high_open; choices: the allowed strings of a str; nullable: None is a valid value
    (e.g. tau_likelihood None = use tau); log: spans decades (charts use a log axis); per_dataset: defaults
    that differ by benchmark dataset (any spelling, stored canonical); when: the hparam matters only when other
    hparams take these values ({"update": ("decay",)}), else it is dropped from a run's config.
    """

    name: str
    kind: str
    default: Any
    doc: str
    role: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    log: bool = False
    per_dataset: Mapping[str, Any] = field(default_factory=dict)
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"hparam name {self.name!r}: expected lower-case letters, digits and _")
        if self.kind not in KINDS:
            raise ValueError(f"hparam {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.role not in ROLES:
            raise ValueError(f"hparam {self.name!r}: role must be one of {ROLES}, got {self.role!r}")
        per_dataset = {canonical_dataset(k): v for k, v in self.per_dataset.items()}
        object.__setattr__(self, "per_dataset", MappingProxyType(per_dataset))
        object.__setattr__(self, "when", MappingProxyType(dict(self.when)))
        for value in (self.default, *per_dataset.values()):
            self.check("registry", value)

    @property
    def expected(self) -> str:
        """What a valid value is, in words (for error messages and the docs)."""
        if self.kind == "str":
            text = f"one of {list(self.choices)}"
        elif self.kind == "bool":
            text = "true or false"
        else:
            noun = "an integer" if self.kind == "int" else "a number"
            if self.low is None and self.high is None:
                text = noun
            elif self.high is None:
                text = f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
            else:
                lo = "(" if self.low_open else "["
                hi = ")" if self.high_open else "]"
                low = "-inf" if self.low is None else f"{self.low:g}"
                high = "inf" if self.high is None else f"{self.high:g}"
                text = f"{noun} in {lo}{low}, {high}{hi}"
        return text + (" or null" if self.nullable else "")

    def check(self, method: str, value: Any) -> Any:
        """The value in its kind (an integral float becomes an int), or a ValueError naming method and hparam."""
        def bad() -> ValueError:
            return ValueError(f"{method}: hparam {self.name!r} must be {self.expected} ({self.doc}), got {value!r}")

        if value is None:
            if self.nullable:
                return None
            raise bad()
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise bad()
            return value
        if self.kind == "str":
            if not isinstance(value, str) or value not in self.choices:
                raise bad()
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise bad()
        if self.kind == "int":
            if not float(value).is_integer():
                raise bad()
            value = int(value)
        else:
            value = float(value)
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise bad()
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            raise bad()
        return value


@dataclass(frozen=True)
class MethodCard:
    """One method.

    name: the spec's and the results' key; label: as tables write it; order: display order (tables, legends);
    family: methods that share a colour family in charts; summary: what adapts (the docs' methods table);
    impl: "module:Class" of its `orchestrator.methods.Method` subclass (or the class); inputs: 'single'
    (features [n, d]), 'views' (features [n, V, d], view 0 the original) or 'either' (both; augmented views
    used as its official code uses them); views_when: for 'either', a run is handed a stream's views only when
    its hparams take these values ({"view_selection": ("adaptive",)}; empty: always), else the views' confident
    means; views: the view kind of its official protocol where it takes views ('augmix' or 'crops') and
    view_count how many (the original included);
    view_scope: 'all' (its protocol augments every dataset) or 'protocol' (only the datasets whose own protocol
    has views, ImageNet-A/-V2/-R/-Sketch: on the others it gets the single view as V = 1);
    single_view_datasets: where its official protocol takes the single view all the same (BoostAdapter on
    ImageNet); prior: it learns a prior V saved with the run (state.npz: V, C2, ...) and `prior_count` names the
    hparam its counter C2 starts from; baseline: zero-shot
    CLIP, which gains are measured against; state: names of the state tensors its trace exposes; stream_length:
    the hparam a sweep sets to the stream's length where it is null (a schedule over the whole stream, while
    the trial feeds it in parts); source: the official code it follows.
    """

    name: str
    label: str
    order: int
    family: str
    summary: str
    impl: Any
    hparams: tuple[HParam, ...] = ()
    inputs: str = "single"
    views_when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    views: str | None = None
    view_count: int = 64
    view_scope: str = "all"
    single_view_datasets: tuple[str, ...] = ()
    prior: bool = False
    prior_count: str | None = None
    baseline: bool = False
    state: tuple[str, ...] = ()
    stream_length: str | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if not _NAME_RE.match(self.name):
            raise ValueError(f"method name {self.name!r}: expected lower-case letters, digits and _")
        if self.inputs not in INPUTS:
            raise ValueError(f"method {self.name!r}: inputs must be one of {INPUTS}, got {self.inputs!r}")
        if self.views is not None and self.views not in VIEW_KINDS:
            raise ValueError(f"method {self.name!r}: views must be one of {VIEW_KINDS} or None, got {self.views!r}")
        if self.view_scope not in ("all", "protocol"):
            raise ValueError(f"method {self.name!r}: view_scope must be 'all' or 'protocol', got {self.view_scope!r}")
        names = [h.name for h in self.hparams]
        if len(set(names)) != len(names):
            raise ValueError(f"method {self.name!r}: an hparam is declared twice in {names}")
        for h in self.hparams:
            unknown = set(h.when) - set(names)
            if unknown:
                raise ValueError(f"method {self.name!r}: hparam {h.name!r} depends on unknown {sorted(unknown)}")
        unknown = set(self.views_when) - set(names)
        if unknown or (self.views_when and self.inputs != "either"):
            raise ValueError(f"method {self.name!r}: views_when needs inputs 'either' and its own hparams, got "
                             f"inputs {self.inputs!r} and {sorted(self.views_when)}")
        object.__setattr__(self, "views_when", MappingProxyType(dict(self.views_when)))
        for field_name in ("prior_count", "stream_length"):
            value = getattr(self, field_name)
            if value is not None and value not in names:
                raise ValueError(f"method {self.name!r}: {field_name} {value!r} is not one of its hparams")

    @property
    def takes_views(self) -> bool:
        return self.inputs == "views"

    def protocol_views(self, dataset: str) -> str:
        """The views of the official protocol for this method on a benchmark dataset: a view kind
        ('augmix', 'crops'; 63 views + the original) or 'single'. Methods taking one feature get the dataset's
        own protocol (AugMix on ImageNet-A/-V2/-R/-Sketch, reduced to the confident views' mean)."""
        own = dataset_card(dataset).views
        if not self.takes_views or (self.view_scope == "protocol" and own == "single"):
            return own
        if dataset_card(dataset).name in {canonical_dataset(d) for d in self.single_view_datasets}:
            return "single"
        if self.views is None:
            return own
        return self.views if self.view_count == 64 else f"{self.views}{self.view_count - 1}"

    def wants_views(self, hparams: Mapping[str, Any]) -> bool:
        """Whether a run with these hparams (unset ones at their defaults) is handed a stream's augmented views
        [n, V, d] rather than their confident-view means [n, d]."""
        if self.inputs != "either":
            return self.takes_views
        merged = {**self.defaults(), **hparams}
        return all(merged.get(name) in allowed for name, allowed in self.views_when.items())

    def hparam(self, name: str) -> HParam:
        for h in self.hparams:
            if h.name == name:
                return h
        raise ValueError(f"unknown hparam {name!r} for method {self.name!r}; valid hparams: {self.hparam_names}")

    @property
    def hparam_names(self) -> list[str]:
        return sorted(h.name for h in self.hparams)

    def defaults(self, dataset: str | None = None) -> dict[str, Any]:
        """Every hparam with its default; for a benchmark dataset, its per-dataset defaults (the card's per_dataset)."""
        key = dataset_key(dataset) if dataset is not None else None
        return {h.name: h.per_dataset.get(key, h.default) for h in self.hparams}

    def resolve(self, hparams: Mapping[str, Any], dataset: str | None = None) -> dict[str, Any]:
        """Defaults overlaid by `hparams`, each value checked and in its kind; unknown names are refused."""
        unknown = sorted(set(hparams) - {h.name for h in self.hparams})
        if unknown:
            raise ValueError(f"unknown hparam {unknown[0]!r} for method {self.name!r}; "
                             f"valid hparams: {self.hparam_names}")
        merged = {**self.defaults(dataset), **hparams}
        return {h.name: h.check(self.name, merged[h.name]) for h in self.hparams}

    def inert(self, hparams: Mapping[str, Any]) -> list[str]:
        """The hparams that cannot affect a run with these values (their `when` is not met)."""
        return [h.name for h in self.hparams
                if any(hparams.get(other) not in allowed for other, allowed in h.when.items())]

    def implementation(self) -> type:
        """The Method subclass (imported on first use: the card itself needs no torch)."""
        if isinstance(self.impl, str):
            module, _, attr = self.impl.partition(":")
            return getattr(importlib.import_module(module), attr)
        return self.impl


_CARDS: dict[str, MethodCard] = {}
_PLUGINS_LOADED: set[str] = set()
_KINDS_CACHE: list[Any] = [None, {}]  # (registered cards when computed, name -> kind)
PLUGINS_ENV = "BCA_PLUGINS"


def register_method(card: MethodCard) -> MethodCard:
    """Add a card. The same name twice is refused unless it is the same card (a module imported again); an hparam
    name shared with another method must have the same kind there (it is one results column)."""
    _builtins()
    old = _CARDS.get(card.name)
    if old is not None and old != card:
        raise ValueError(f"method {card.name!r} is already registered (by {old.impl!r}); choose another name")
    columns = _kinds()
    for h in card.hparams:
        if columns.get(h.name, h.kind) != h.kind:
            raise ValueError(f"method {card.name!r}: hparam {h.name!r} is {h.kind}, but another method declares it "
                             f"{columns[h.name]} (one results column per name): rename it")
    _CARDS[card.name] = card
    return card


def load_plugins(modules: tuple[str, ...] | list[str] = ()) -> None:
    """Import plugin modules (each registers its cards), those named and those in BCA_PLUGINS."""
    names = [*modules, *(m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip())]
    for name in names:
        if name not in _PLUGINS_LOADED:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                raise ValueError(f"plugin module {name!r} cannot be imported ({exc}); expected a module on the "
                                 f"Python path that calls orchestrator.registry.register_method") from None
            _PLUGINS_LOADED.add(name)


def _ensure_loaded() -> None:
    _builtins()
    load_plugins()


def _builtins() -> None:
    """The built-in cards first (a no-op once imported, and while they are being imported)."""
    importlib.import_module("orchestrator.registry.cards")


def method_cards() -> list[MethodCard]:
    """Every registered card in display order."""
    _ensure_loaded()
    return sorted(_CARDS.values(), key=lambda c: (c.order, c.name))


def method_names() -> list[str]:
    return [c.name for c in method_cards()]


def method_card(name: str) -> MethodCard:
    _ensure_loaded()
    card = _CARDS.get(name) if isinstance(name, str) else None
    if card is None:
        raise ValueError(f"unknown method {name!r}; valid methods: {', '.join(method_names())}")
    return card


def find_method(name: str) -> MethodCard | None:
    """The card of `name`, or None for a method this process does not know (e.g. a plugin not loaded)."""
    _ensure_loaded()
    return _CARDS.get(name)


def method_label(name: str) -> str:
    card = find_method(name)
    return card.label if card else name


def method_rank(name: str) -> tuple[int, str]:
    """Sort key: display order, unknown methods last by name."""
    card = find_method(name)
    return (card.order if card else 10**6, name)


def baseline_method() -> str:
    """The zero-shot baseline's name (gains are measured against it)."""
    return next(c.name for c in method_cards() if c.baseline)


def _kinds() -> dict[str, str]:
    return {h.name: h.kind for c in _CARDS.values() for h in c.hparams}


def hparam_kinds() -> dict[str, str]:
    """Every hparam name of every registered method -> its kind (one results column each), in display order.
    Asked once per run config, so it is recomputed only when a card was registered since."""
    _ensure_loaded()
    if _KINDS_CACHE[0] != len(_CARDS):
        _KINDS_CACHE[:] = [len(_CARDS), {h.name: h.kind for c in method_cards() for h in c.hparams}]
    return _KINDS_CACHE[1]


def hparam_is_log(name: str) -> bool:
    """Whether any registered method declares hparam `name` as spanning decades (charts use a log axis)."""
    return any(h.name == name and h.log for c in method_cards() for h in c.hparams)


def hparam_docs() -> dict[str, str]:
    out: dict[str, str] = {}
    for card in method_cards():
        for h in card.hparams:
            out.setdefault(h.name, h.doc)
    return out
