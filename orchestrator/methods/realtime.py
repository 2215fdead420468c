"""A method on a realtime stream (`orchestrator.data.streams.Realtime`): it adapts on the samples at stream
positions 0, k, 2k, ... and, busy with that step, predicts the k - 1 samples after each from its current state
without adapting (its `frozen`: `Method.offers_frozen`). Those rows select nothing and gate nothing; the trace's
state is the state after the last adapting step. Positions count from the stream's start across calls, so a run fed
in parts gives the rows of one call (Alfarra et al., ICML 2024, "Evaluation of Test-Time Adaptation Under
Computational Time Constraints": samples arriving while the model adapts are predicted by the current model)."""

from __future__ import annotations

from typing import Mapping

import torch

from orchestrator.methods.base import Method, StageTimer, Trace, concat_traces, empty_trace


class RealtimeMethod:
    """`method` adapting on every `k`-th sample of the stream, the others predicted by its state as it is."""

    def __init__(self, method: Method, k: int) -> None:
        self.method, self.k = method, k
        self.position = 0
        self.state: dict[str, torch.Tensor] = method.state_tensors()

    def run(self, features: torch.Tensor, auxiliary: Mapping[str, torch.Tensor] | None = None) -> Trace:
        n, k = features.shape[0], self.k
        traces = []
        i = 0
        while i < n:
            offset = (self.position + i) % k
            if offset == 0:
                trace = self.method.run(features[i:i + 1], None if auxiliary is None else
                                        {name: feats[i:i + 1] for name, feats in auxiliary.items()})
                self.state = trace.state
                traces.append(trace)
                i += 1
                continue
            end = min(n, i + k - offset)
            _, selected, gated, gated_prior = empty_trace(end - i, self.method.num_classes, features.device)
            timer = StageTimer()
            with timer("posterior"):
                posteriors = self.method.frozen(features[i:end])
            traces.append(Trace(posteriors, selected, gated, gated_prior, state=self.state, timings=timer.seconds))
            i = end
        self.position += n
        if not traces:
            return Trace(*empty_trace(0, self.method.num_classes, features.device), state=self.state)
        return concat_traces(traces)
