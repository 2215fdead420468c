"""The BCA family's lockstep runner. On one feature per sample: the exact blocked engine
(`orchestrator.methods.engine`), which runs the configs of clip, la, pa and bca together (one logits product per
group of configs whose U evolves alike). On augmented views: view_selection='adaptive' configs step together
(`views.run_bca_views_many`, also over stream orders), 'fixed' ones run the engine on the views they select once,
as the single-stream method does. Over stream orders the engine takes one order at a time: a block restarts
wherever one of its samples' normaliser drifts (`engine`), so the orders' groups meet no common block boundary
to share a product at, and the walk, on the host, takes a group at a time per thread."""

from __future__ import annotations

import torch

from orchestrator.methods.base import Trace, validate_features
from orchestrator.methods.bca import views
from orchestrator.methods.bca.method import BCAFamily
from orchestrator.methods.engine import run_bca_blocked_many
from orchestrator.methods.lockstep import gather_members, run_over_orders, takes_orders
from orchestrator.methods.views import confident_view_means


def _engine(methods: list[BCAFamily], features: torch.Tensor) -> list[Trace]:
    first = methods[0]
    return run_bca_blocked_many(features, [m.state for m in methods], first.class_ids, first.num_classes,
                                [m.config for m in methods])


@takes_orders(single=False, views=True)  # one feature per sample: the engine, one order at a time
def run_bca_lockstep(methods: list[BCAFamily], features: torch.Tensor,
                     orders: torch.Tensor | None = None) -> list[Trace]:
    """Fresh BCA-family methods over one stream [n, d] or [n, V, d], or stream g = features[orders[g]]: trace g
    equals `methods[g].run(stream g)`."""
    first = methods[0]
    validate_features(first.name, features, first.class_embeddings, views=None)
    if features.ndim == 3 and features.shape[1] == 1:
        features = features[:, 0]
    if features.ndim == 2:
        return run_over_orders(_engine, methods, features, orders)
    traces: list[Trace | None] = [None] * len(methods)
    adaptive = [g for g, m in enumerate(methods) if m.hp.get("view_selection") == "adaptive" and views.takes(m.config)]
    if adaptive:
        gather_members(traces, adaptive, views.run_bca_views_many(
            features, [methods[g].state for g in adaptive], first.class_ids, first.num_classes,
            [methods[g].config for g in adaptive], None if orders is None else orders[adaptive]))
    fixed = [g for g, m in enumerate(methods) if m.hp.get("view_selection") == "fixed"]
    if fixed:
        means = confident_view_means(features, first.class_embeddings, first.class_ids, first.num_classes)
        gather_members(traces, fixed, run_over_orders(_engine, [methods[g] for g in fixed], means,
                                                      None if orders is None else orders[fixed]))
    for g, method in enumerate(methods):
        if traces[g] is None:  # float16 adaptive state: its own reference loop
            traces[g] = method.run(features if orders is None else features[orders[g]])
    return traces  # type: ignore[return-value]
