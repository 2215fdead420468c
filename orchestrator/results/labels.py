"""How a run's settings read in a label, shared by the tables (`report`) and the tuning notes (`tuning`): a value
as text, and whether a varying hparam adds nothing to a label."""

from __future__ import annotations

from typing import Any

import pandas as pd

from orchestrator import registry
from orchestrator.data.streams import stream_label, stream_value


def fmt_value(value: Any, column: str = "") -> str:
    if column == "stream" and isinstance(value, str):
        return stream_label(stream_value(value))
    return f"{value:g}" if isinstance(value, float) else str(value)


def follows(part: pd.DataFrame, method: str, column: str, vary: list[str]) -> bool:
    """Whether `column` is a gate whose null means another varying hparam (tau_likelihood = tau) and equals it
    in every run: it adds nothing to a label."""
    card = registry.find_method(method)
    names = {h.name: h.null_means for h in card.hparams} if card else {}
    other = names.get(column)
    return other in vary and bool((part[column] == part[other]).all())
