"""Many configurations over one feature stream in one call (the sweep packs grid points into one trial).

    run_stream_many(features, class_embeddings, class_ids, num_classes, configs)
        -> (predictions [G, n] int64, confidences [G, n] float32)
    run_traces_many(...) -> list[Trace], one per config, in config order

Each config is a dict `{"method": name, **hparams}` (and `batch_size` for a batch method's step), validated
exactly as `make_method` validates it (the class inputs once for all). With `orders` [G, n] (int64), config g
runs over features[orders[g]], the stream orders of one feature set (`orchestrator.methods.lockstep`). The
configs whose cards name one lockstep runner taking the features' kind (`MethodCard.lockstep`; the BCA family's is
the blocked engine, one feature per sample) go to it in one call per batch size (a batch method's runner honours
its methods' `batch_size`); any other config runs on its own. Every result equals the separate run (lockstep:
within float32 rounding, `orchestrator.methods.lockstep`).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from orchestrator.methods.base import Method, Trace, build_method, validate_class_inputs
from orchestrator.methods.lockstep import check_orders, run_over_orders
from orchestrator.registry import method_card


def _build(config: Any, index: int, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
           num_classes: int, text: Any) -> Method:
    if not isinstance(config, dict) or "method" not in config:
        raise ValueError(f"configs[{index}] must be a dict with a 'method' key and that method's hparams, "
                         f"got {config!r}")
    hparams = {k: v for k, v in config.items() if k != "method"}
    needs_text = method_card(config["method"]).text_encoder is not None
    return build_method(config["method"], class_embeddings, class_ids, num_classes,
                        text=text if needs_text else None, **hparams)


def run_traces_many(features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
                    num_classes: int, configs: list[dict[str, Any]], text: Any = None,
                    orders: torch.Tensor | None = None, auxiliary: Mapping[str, torch.Tensor] | None = None
                    ) -> list[Trace]:
    """One Trace per config, each equal to `make_method(**config).run(features)` (or of features[orders[g]])
    (a BCA-family trace's state always holds U, V, C1 and C2, also for clip, whose counters never change);
    `text` goes to the configs whose method runs the text encoder (`make_method`), `auxiliary` (features besides,
    a teacher's: `Method.run`'s) to every config, over the stream as given (not with `orders`)."""
    if not isinstance(configs, (list, tuple)) or not configs:
        raise ValueError(f"configs must be a non-empty list of dicts, got {configs!r}")
    if auxiliary is not None and orders is not None:
        raise ValueError("auxiliary features are given over the stream as it is; expected no orders with them")
    validate_class_inputs(class_embeddings, class_ids, num_classes)  # once for the G methods sharing them
    methods = [_build(c, i, class_embeddings, class_ids, num_classes, text) for i, c in enumerate(configs)]
    if orders is not None:
        check_orders(features, orders, len(methods))
    views = isinstance(features, torch.Tensor) and features.ndim == 3
    # one group per runner and batch size (a runner sees methods of one batch size), its configs in config order
    groups: dict[tuple[int, int], tuple[Any, list[int]]] = {}
    for i, method in enumerate(methods):
        runner = method.card().lockstep_runner(views)
        if runner is not None:
            groups.setdefault((id(runner), method.batch_size), (runner, []))[1].append(i)
    if auxiliary is not None and groups:
        raise ValueError("a lockstep runner reads no auxiliary features; expected none for its methods")
    traces: dict[int, Trace] = {}
    for runner, members in groups.values():
        traces.update(zip(members, run_over_orders(runner, [methods[i] for i in members], features,
                                                   None if orders is None else orders[members])))
    for i, method in enumerate(methods):
        if i not in traces:
            traces[i] = (method.run(features, auxiliary) if auxiliary is not None
                         else method.run(features if orders is None else features[orders[i]]))
    return [traces[i] for i in range(len(methods))]


def run_stream_many(features: torch.Tensor, class_embeddings: torch.Tensor, class_ids: torch.Tensor,
                    num_classes: int, configs: list[dict[str, Any]], text: Any = None,
                    orders: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Predictions [G, n] int64 and confidences (max posterior) [G, n] float32, row g for configs[g]."""
    traces = run_traces_many(features, class_embeddings, class_ids, num_classes, configs, text, orders)
    return (torch.stack([t.predictions for t in traces]), torch.stack([t.confidences for t in traces]))
