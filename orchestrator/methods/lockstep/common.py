"""What the lockstep runners share: hparams as per-stream columns, each stream's share of the timings."""

from __future__ import annotations

import torch

from orchestrator.methods.base import Method, StageTimer


def column(methods: list[Method], key: str, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """One hparam of every stream as a [G, 1] tensor (broadcasts against per-stream rows)."""
    return torch.tensor([[m.hp[key]] for m in methods], dtype=dtype, device=device)


def split_timings(timer: StageTimer, g: int) -> dict[str, float]:
    """Each stream's share of the lockstep pass (as a pack reports a run's share of the pass)."""
    return {stage: seconds / g for stage, seconds in timer.seconds.items()}
