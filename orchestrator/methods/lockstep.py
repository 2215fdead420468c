"""What the lockstep runners share. A runner advances G independent states of a method together, one sample per
batched step: `run(methods, features) -> list[Trace]`, trace g equal to `methods[g].run(features)` (predictions,
selections and gates identical, posteriors within float32 rounding: the batched products sum in another order).
A card names its runner (`MethodCard.lockstep`); `many.run_traces_many` hands each runner the configs of a pack
whose cards name it. Here: hparams as per-stream columns, streams grouped by the hparams that define a shared
state, each stream's share of the timings, a runner written for one card taking a mix of the cards that name it
(`per_card`), and `run_lockstep` for a list of methods."""

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


def per_card(run: Runner) -> Runner:
    """A runner written for the methods of one card, made to take any mix of the cards that name it: each card's
    methods go to `run` together, in their order."""
    @functools.wraps(run)
    def mixed(methods: list[Method], features: torch.Tensor, **options: Any) -> list[Trace]:
        names, index = group_by([m.name for m in methods])
        traces: list[Trace | None] = [None] * len(methods)
        for k in range(len(names)):
            members = [g for g, i in enumerate(index) if i == k]
            for g, trace in zip(members, run([methods[g] for g in members], features, **options)):
                traces[g] = trace
        return traces  # type: ignore[return-value]
    return mixed


def run_lockstep(methods: list[Method], features: torch.Tensor) -> list[Trace]:
    """Fresh methods (from `make_method`) whose cards name one lockstep runner that takes these features, over
    one feature stream: one Trace per method."""
    runners = [m.card().lockstep_runner(features.ndim == 3) for m in methods]
    if not methods or any(r is None for r in runners) or len({id(r) for r in runners}) != 1:
        names = sorted({m.name for m in methods})
        raise ValueError(f"run_lockstep takes methods whose cards name one lockstep runner taking features of shape "
                         f"{tuple(features.shape)}, got {names}")
    return runners[0](methods, features)
