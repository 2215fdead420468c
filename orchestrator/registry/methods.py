"""The method registry: one card per method, every fact about it in one record that everything else asks.

A card is plain data (no torch): its label and display order, each hyperparameter (type, range, default, doc,
role, per-dataset defaults, when it matters), the inputs it needs (a single feature or augmented views, and
which view kind its official protocol uses), the state it exposes (a prior to draw, caches, ...), and where
its implementation lives (`impl`, "module:Class", and its optional lockstep runner, `Lockstep("module:function")`,
each imported only when a run needs it), composed of focused records (`orchestrator.registry.card`). Spec
validation, the results schema's hyperparameter columns, the report's and dashboard's labels, filters and prior
view, the routing of a pack's configs (`orchestrator.methods.many`) and the methods table of docs/methods.md all
derive from the cards; `orchestrator.methods` checks hparams through them.

A method is one folder: `card.py` (plain data: `CARDS`, a tuple of `MethodCard`s, importing only
`orchestrator.registry.card`), `method.py` (the single-stream method), optionally `lockstep.py` (its lockstep
runner) and `reference.py` (a plain transcription of its official code). The built-in ones are the folders
`orchestrator/methods/*/`, found on disk, so the registry names no method and a card module does not import
this table back. A plugin has the same shape: a package outside the project (its `card` module is read), or
one module holding all of it (its `CARDS` are read; calling `register_method` works too). A sweep spec names
plugins under `plugins:` and `BCA_PLUGINS` (comma-separated names) loads them in any process, the dashboard's
included.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from orchestrator.registry.card import INPUTS, KINDS, ROLES, HParam, MethodCard

__all__ = ["INPUTS", "KINDS", "ROLES", "HParam", "MethodCard", "register_method", "load_plugins",
           "method_cards", "method_names", "method_card", "find_method", "method_label", "method_rank", "baseline_method", "hparam_kinds", "hparam_is_log",
           "hparam_docs"]

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
    """Import plugin modules or packages and register their cards, those named and those in BCA_PLUGINS."""
    names = [*modules, *(m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip())]
    for name in names:
        if name not in _PLUGINS_LOADED:
            try:
                _load_method_folder(name)
            except ImportError as exc:
                raise ValueError(f"plugin module {name!r} cannot be imported ({exc}); expected a module or package "
                                 f"on the Python path whose card module holds CARDS (orchestrator.registry.card)"
                                 ) from None
            _PLUGINS_LOADED.add(name)


def _load_method_folder(name: str) -> None:
    """Register the CARDS of a method's card module: `name.card` for a package that has one, else `name`."""
    module = importlib.import_module(name)
    if hasattr(module, "__path__") and importlib.util.find_spec(f"{name}.card") is not None:
        module = importlib.import_module(f"{name}.card")
    for card in getattr(module, "CARDS", ()):
        if not isinstance(card, MethodCard):
            raise ValueError(f"{module.__name__}.CARDS holds {card!r}; expected MethodCard objects")
        register_method(card)


def _ensure_loaded() -> None:
    _builtins()
    load_plugins()


# The built-in methods: every folder of orchestrator/methods with a card.py, found on disk, so that a new
# method is one folder and no edit elsewhere.
_METHODS_DIR = Path(__file__).resolve().parents[1] / "methods"
_BUILTINS_LOADED: list[bool] = []


def _builtins() -> None:
    """The built-in cards first (a no-op once loaded, and while they are being loaded)."""
    if _BUILTINS_LOADED:
        return
    _BUILTINS_LOADED.append(True)
    package = __name__.rsplit(".", 2)[0] + ".methods"
    try:
        for card in sorted(_METHODS_DIR.glob("*/card.py")):
            _load_method_folder(f"{package}.{card.parent.name}")
    except BaseException:
        _BUILTINS_LOADED.clear()
        raise


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
