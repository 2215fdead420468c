"""Online test-time adaptation methods over CLIP embeddings: pure tensor state machines, no I/O.

    run_stream(method, features, class_embeddings, class_ids, num_classes, **hparams) -> posteriors [n, K]
    make_method(method, class_embeddings, class_ids, num_classes, **hparams).run(features) -> Trace
    run_stream_many(features, class_embeddings, class_ids, num_classes, configs) -> (predictions [G, n],
    confidences [G, n]); run_traces_many(...) -> one Trace per config (`many.py`: each config to the lockstep
    runner its card names, the others one by one)

A method is one folder here, `<name>/`: `card.py` (its registry card: label, hparams with types, ranges,
defaults and per-dataset defaults, inputs, state, and where its method and lockstep runner live),
`method.py` (the single-stream method), optionally `lockstep.py` (G configs over one stream in one pass) and
`reference.py` (a plain transcription of its official code). The registry finds the folders on disk
(`orchestrator.registry.method_card(name)`). What several methods share stays here: `base.py` (Method,
Trace, validation, make_method), `views.py` (the confident-view rule), `prototypes.py`, `adamw.py`,
`episodic.py` (the methods that solve each sample alone, and their common lockstep runner), `engine.py` (the
BCA family's exact blocked engine), `lockstep.py` (the runners' helpers), `hparams.py` (hparams several
cards declare alike). Inputs are float32, expected L2-normalised, on any one torch device.

This package imports without torch (the registry loads the cards from it); the names below are imported on
first use.
"""

from __future__ import annotations

from typing import Any


# Lazy imports as functions holding an import statement, which static tools follow (a name in a string they
# would not).
def _import_base() -> Any:
    from orchestrator.methods import base

    return base


def _import_many() -> Any:
    from orchestrator.methods import many

    return many


_EXPORTS = {"Method": _import_base, "BatchMethod": _import_base, "Trace": _import_base, "make_method": _import_base,
            "run_stream": _import_base, "run_stream_many": _import_many, "run_traces_many": _import_many}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(_EXPORTS[name](), name)
