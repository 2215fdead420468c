"""How far two float32 runs of one case may differ (a lockstep or device run against the method's single-stream
CPU run): a multiple of the single-stream run's own drift from a float64 run of that same case, the method's
official loop transcribed (orchestrator/methods/*/reference.py). A method whose steps amplify rounding (OnZeta's
large early proxy steps) gets a tolerance that follows how far this case amplifies it on this CPU, where a fixed
number holds on one CPU and fails on another. Used by `benchmarks.gpu` and the lockstep tests.
"""

from __future__ import annotations

import torch

# Two float32 runs that each sit within the drift d of the float64 run are within 2 d of each other; twice that
# again for a run that sums in another order (block products), whose own drift may exceed the loop's.
DRIFT_MULTIPLE = 4


def float64_run(method: str, features: torch.Tensor, class_embeddings: torch.Tensor,
                config: dict) -> dict[str, torch.Tensor] | None:
    """The case in float64 from the method's reference, as {"posteriors": [n, K], state name: tensor} in the
    trace's layout; None for a method whose reference does not take the case as given."""
    from orchestrator.registry import method_card

    card = method_card(method)
    hp = {**card.defaults(), **config}
    if card.stream_length is not None and hp.get(card.stream_length) is None:
        hp[card.stream_length] = features.shape[0]
    if method == "onzeta":
        from orchestrator.methods.onzeta.reference import official_onzeta

        posteriors, w, rho = official_onzeta(features, class_embeddings, **hp)
        return {"posteriors": posteriors, "W": w.T, "rho": rho}
    return None


def drift_tolerances(method: str, features: torch.Tensor, class_embeddings: torch.Tensor, config: dict,
                     single, floor: float) -> dict[str, float]:
    """For the posteriors and each floating state tensor of the float32 single-stream trace `single`:
    DRIFT_MULTIPLE times its largest difference from the float64 run of the same case, at least `floor` (which
    is all a tensor gets where the method has no float64 run, or the reference does not return it)."""
    exact = float64_run(method, features.cpu(), class_embeddings.cpu(), config) or {}
    got = {"posteriors": single.posteriors, **{k: v for k, v in single.state.items() if v.is_floating_point()}}
    return {key: max(floor, DRIFT_MULTIPLE * float((value.cpu().double() - exact[key]).abs().max()))
            if key in exact else floor for key, value in got.items()}
