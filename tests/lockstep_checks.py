"""The check every lockstep test makes: a lockstep trace against the same method run alone."""

from __future__ import annotations

import torch


def assert_same_trace(single, lock, name: str, atol: float | dict[str, float] = 1e-5) -> None:
    """A lockstep trace equals the single-stream one: predictions, selections and gates identical, posteriors
    and floating state within atol (the batched products sum in another order; one number, or one per tensor:
    "posteriors" and state names, as `benchmarks.drift.drift_tolerances` gives them), other state identical."""
    tol = atol if isinstance(atol, dict) else {}
    default = atol if not isinstance(atol, dict) else None
    assert torch.equal(single.predictions, lock.predictions), name
    gap = float((single.posteriors - lock.posteriors).abs().max())
    assert gap < tol.get("posteriors", default), (name, gap, tol.get("posteriors", default))
    for field in ("selected", "gated", "gated_prior"):
        assert torch.equal(getattr(single, field), getattr(lock, field)), (name, field)
    assert single.state.keys() == lock.state.keys()
    for key, value in single.state.items():
        if value.is_floating_point():
            torch.testing.assert_close(lock.state[key], value, atol=tol.get(key, default), rtol=0,
                                       msg=f"{name} state {key}")
        else:
            assert torch.equal(lock.state[key], value), (name, key)
