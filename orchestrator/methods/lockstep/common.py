"""What the lockstep runners share: hparams as per-stream columns, streams grouped by the hparams that define
a shared state, each stream's share of the timings."""

from __future__ import annotations

from typing import Hashable, TypeVar

import torch

from orchestrator.methods.base import Method, StageTimer


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
