"""What the lockstep runners share. A runner advances G independent states of a method together, one sample per
batched step: `run(methods, features) -> list[Trace]`, trace g equal to `methods[g].run(features)` (predictions,
selections and gates identical, posteriors within float32 rounding: the batched products sum in another order).
A card names its runner (`MethodCard.lockstep`); `many.run_traces_many` hands each runner the configs of a pack
whose cards name it. Here: hparams as per-stream columns, streams grouped by the hparams that define a shared
state, each stream's share of the timings, a runner written for one card taking a mix of the cards that name it
(`per_card`), and `run_lockstep` for a list of methods.

Orders: the G streams may also be G orders of one cached feature set (a sweep's `orders: N` permutes one
dataset's features; features are cached once). `orders` [G, n] int64 says stream g is `features[orders[g]]`,
and trace g equals `methods[g].run(features[orders[g]])`. A runner marked `takes_orders` takes `orders=` itself
and says, per kind of features (one feature per sample, [n, d] or one view [n, 1, d]; views [n, V > 1, d]),
whether it steps the orders together there or one order at a time (`steps_orders`, which the dry run's count of
runs stepped alone and benchmarks.study ask); any other runner gets the streams of each distinct order together
(`run_over_orders`)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Hashable, TypeVar

import torch

from orchestrator.methods.base import Method, StageTimer, Trace

Runner = Callable[..., list[Trace]]


def column(methods: list[Method], key: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One hparam of every stream as a [G, 1] tensor (broadcasts against per-stream rows)."""
    return torch.tensor([[m.hp[key]] for m in methods], dtype=dtype, device=device)


Key = TypeVar("Key", bound=Hashable)


def group_by(keys: list[Key]) -> tuple[list[Key], list[int]]:
    """The distinct keys in first-seen order, and each key's index among them."""
    distinct = list(dict.fromkeys(keys))
    return distinct, [distinct.index(key) for key in keys]


def split_timings(timer: StageTimer, g: int) -> dict[str, float]:
    """Each stream's share of the lockstep pass (as a pack reports a run's share of the pass)."""
    return {stage: seconds / g for stage, seconds in timer.seconds.items()}


def takes_orders(*, single: bool, views: bool) -> Callable[[Runner], Runner]:
    """Mark a runner that takes `orders=` [G, n] itself, and whether it steps the orders together on one feature
    per sample (`single`) and on views (`views`); where it does not, it runs them one order at a time."""
    def mark(run: Runner) -> Runner:
        run.orders_together = {"single": single, "views": views}  # type: ignore[attr-defined]
        return run
    return mark


def steps_orders(run: Runner | None, views: bool) -> bool:
    """Whether `run` steps G orders of one feature set together on that kind of features (`takes_orders`)."""
    return bool(getattr(run, "orders_together", {}).get("views" if views else "single", False))


def gather_members(traces: list[Trace | None], members: list[int], results: list[Trace]) -> None:
    for g, trace in zip(members, results):
        traces[g] = trace


def per_card(run: Runner) -> Runner:
    """A runner written for the methods of one card, made to take any mix of the cards that name it: each card's
    methods go to `run` together, in their order (with their rows of `orders`, where given)."""
    @functools.wraps(run)
    def mixed(methods: list[Method], features: torch.Tensor, **options: Any) -> list[Trace]:
        names, index = group_by([m.name for m in methods])
        orders = options.pop("orders", None)
        traces: list[Trace | None] = [None] * len(methods)
        for k in range(len(names)):
            members = [g for g, i in enumerate(index) if i == k]
            mine = {} if orders is None else {"orders": orders[members]}
            gather_members(traces, members, run([methods[g] for g in members], features, **mine, **options))
        return traces  # type: ignore[return-value]
    return mixed


def check_orders(features: torch.Tensor, orders: torch.Tensor, streams: int) -> None:
    """orders: [streams, n] int64 indices into the N feature rows."""
    if (not isinstance(orders, torch.Tensor) or orders.dtype != torch.int64 or orders.ndim != 2
            or orders.shape[0] != streams or orders.device != features.device):
        raise ValueError(f"orders must be an int64 tensor [G, n] on {features.device} with G = {streams} streams, "
                         f"got {orders.dtype if isinstance(orders, torch.Tensor) else type(orders).__name__} "
                         f"{tuple(orders.shape) if isinstance(orders, torch.Tensor) else ''}")
    if orders.numel() and (int(orders.min()) < 0 or int(orders.max()) >= features.shape[0]):
        raise ValueError(f"orders index features' {features.shape[0]} rows: expected values in [0, "
                         f"{features.shape[0] - 1}], got [{int(orders.min())}, {int(orders.max())}]")


def run_over_orders(run: Runner, methods: list[Method], features: torch.Tensor, orders: torch.Tensor | None,
                    **options: Any) -> list[Trace]:
    """`run` over G streams, stream g being features[orders[g]] (or `features` when orders is None): a runner
    marked `takes_orders` gets them all; any other gets the streams of each distinct order together."""
    if orders is None:
        return run(methods, features, **options)
    check_orders(features, orders, len(methods))
    if hasattr(run, "orders_together"):
        return run(methods, features, orders=orders, **options)
    return each_order(run, methods, features, orders, **options)


def each_order(run: Runner, methods: list[Method], features: torch.Tensor, orders: torch.Tensor,
               **options: Any) -> list[Trace]:
    """`run` once per distinct order row, over the streams of that order."""
    distinct, index = torch.unique(orders, dim=0, return_inverse=True)
    traces: list[Trace | None] = [None] * len(methods)
    for k in range(distinct.shape[0]):
        members = torch.nonzero(index == k).flatten().tolist()
        gather_members(traces, members, run([methods[g] for g in members], features[distinct[k]], **options))
    return traces  # type: ignore[return-value]


def run_lockstep(methods: list[Method], features: torch.Tensor, orders: torch.Tensor | None = None) -> list[Trace]:
    """Fresh methods (from `make_method`) whose cards name one lockstep runner that takes these features, over
    one feature stream, or stream g = features[orders[g]] (module docstring): one Trace per method."""
    runners = [m.card().lockstep_runner(features.ndim == 3) for m in methods]
    if not methods or any(r is None for r in runners) or len({id(r) for r in runners}) != 1:
        names = sorted({m.name for m in methods})
        raise ValueError(f"run_lockstep takes methods whose cards name one lockstep runner taking features of shape "
                         f"{tuple(features.shape)}, got {names}")
    return run_over_orders(runners[0], methods, features, orders)
