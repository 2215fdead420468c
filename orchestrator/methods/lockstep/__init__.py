"""Lockstep streams: G independent states of one method advanced together, one sample per batched step.

    run_lockstep(methods, features) -> list[Trace], one per method, each equal to `methods[g].run(features)`
    LOCKSTEP: the Method classes that have a lockstep runner (`many.run_traces_many` routes them here)

A per-sample loop on a CPU (or a GPU) pays a fixed cost per tensor operation; G configurations of a pack
over one stream pay it once here. Every per-stream gate and update is a mask or an index operation over the
G (or H) rows, never a Python branch per stream. Each runner starts from the methods' initial state (fresh
objects from `make_method`), takes the features as `Method.run` does, and matches the single-stream method:
predictions, selections and gates identical, posteriors within float32 rounding (the batched products sum
in another order than the single-stream ones).

One module per method holds its runner and says how it shares work between streams (`tda`, `onzeta`,
`dmn_zs`, `boostadapter`, `dota`, `dpe`; `episodic` for the methods that solve each sample alone); a new runner is
one entry in LOCKSTEP.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from orchestrator.methods.base import Method, Trace
from orchestrator.methods.boostadapter import BoostAdapter
from orchestrator.methods.dmn_zs import DMNZeroShot
from orchestrator.methods.dota import DOTA
from orchestrator.methods.dpe import DPE
from orchestrator.methods.lockstep.boostadapter import run_boostadapter_lockstep
from orchestrator.methods.lockstep.dmn_zs import run_dmn_lockstep
from orchestrator.methods.lockstep.dota import run_dota_lockstep
from orchestrator.methods.lockstep.dpe import run_dpe_lockstep
from orchestrator.methods.lockstep.episodic import run_episodic_lockstep
from orchestrator.methods.lockstep.onzeta import run_onzeta_lockstep
from orchestrator.methods.lockstep.tda import run_tda_lockstep
from orchestrator.methods.mta import MTA
from orchestrator.methods.onzeta import OnZeta
from orchestrator.methods.tda import TDA, TDAWithPrior
from orchestrator.methods.tps import TPS
from orchestrator.methods.zero import Zero


class Lockstep(NamedTuple):
    """A lockstep runner and the features it takes: views [n, V, d] (True), one feature [n, d] (False) or
    either (None), as `validate_features` counts them."""

    run: Callable[[list[Method], torch.Tensor], list[Trace]]
    views: bool | None

    def takes(self, features: torch.Tensor) -> bool:
        return self.views is None or self.views == (features.ndim == 3)


LOCKSTEP: dict[type, Lockstep] = {
    TDA: Lockstep(run_tda_lockstep, None), TDAWithPrior: Lockstep(run_tda_lockstep, None),
    OnZeta: Lockstep(run_onzeta_lockstep, False), DMNZeroShot: Lockstep(run_dmn_lockstep, True),
    Zero: Lockstep(run_episodic_lockstep, True), MTA: Lockstep(run_episodic_lockstep, True),
    BoostAdapter: Lockstep(run_boostadapter_lockstep, True),
    TPS: Lockstep(run_episodic_lockstep, True),
    DOTA: Lockstep(run_dota_lockstep, True),
    DPE: Lockstep(run_dpe_lockstep, True),
}


def run_lockstep(methods: list[Method], features: torch.Tensor) -> list[Trace]:
    """Fresh methods of one class with a lockstep runner, over one feature stream: one Trace per method."""
    kinds = {type(m) for m in methods}
    if len(kinds) != 1 or next(iter(kinds)) not in LOCKSTEP:
        names = sorted(k.__name__ for k in kinds)
        raise ValueError(f"run_lockstep takes methods of one class with a lockstep runner "
                         f"({sorted(k.__name__ for k in LOCKSTEP)}), got {names}")
    return LOCKSTEP[type(methods[0])].run(methods, features)
