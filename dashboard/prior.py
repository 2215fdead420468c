"""The learned prior of a run against CLIP's one-hot prior (the supplementary's prior figure).

A run's state.npz holds V [M, K] (row m: the prior P(Y | μ_m) of class embedding m), class_ids [M] (the class
each embedding was built for) and the update counters C2 [M] (n2 plus the number of prior updates). CLIP's
prior is the one-hot row at class_ids[m]. Pure numpy/pandas, no I/O.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

OTHER = "other classes"


def check_state(state: Mapping[str, np.ndarray]) -> str | None:
    """Why this state cannot show a prior, or None when it can."""
    missing = [k for k in ("V", "class_ids") if k not in state]
    if missing:
        return f"the saved state has no {' or '.join(missing)} (arrays present: {sorted(state)})"
    v, ids = np.asarray(state["V"]), np.asarray(state["class_ids"])
    if v.ndim != 2 or ids.ndim != 1 or len(ids) != v.shape[0]:
        return f"V {v.shape} and class_ids {ids.shape}: expected V [M, K] and class_ids [M]"
    if len(ids) and (ids.min() < 0 or ids.max() >= v.shape[1]):
        return f"class_ids span {ids.min()}..{ids.max()}, outside the K = {v.shape[1]} columns of V"
    return None


def class_prior(v: np.ndarray, class_ids: np.ndarray) -> np.ndarray:
    """[K, K]: row c is the mean prior over the class embeddings built for class c (M = K * templates)."""
    k = v.shape[1]
    sums = np.zeros((k, k), dtype=np.float64)
    np.add.at(sums, class_ids, v.astype(np.float64))
    counts = np.bincount(class_ids, minlength=k).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts[:, None]


def prior_updates(state: Mapping[str, np.ndarray], n2: float | None) -> np.ndarray:
    """Prior updates per class: C2 minus its initial value n2, summed over the class's embeddings."""
    ids = np.asarray(state["class_ids"])
    k = np.asarray(state["V"]).shape[1]
    if "C2" not in state:
        return np.zeros(k)
    c2 = np.asarray(state["C2"], dtype=np.float64)
    start = n2 if n2 is not None and np.isfinite(n2) else c2.min()
    return np.bincount(ids, weights=c2 - start, minlength=k)


def top_classes(state: Mapping[str, np.ndarray], n2: float | None, top: int) -> list[int]:
    """The `top` classes whose prior was updated most (ties and never-updated classes by class id)."""
    updates = prior_updates(state, n2)
    order = np.lexsort((np.arange(len(updates)), -updates))
    return [int(c) for c in order[:top]]


def heatmap_frames(state: Mapping[str, np.ndarray], classes: list[int],
                   names: Mapping[int, str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(learned, clip) long frames for charts.prior_heatmap over `classes`, plus an 'other classes' column
    holding the mass the prior puts outside them, so every row still sums to its total."""
    learned = class_prior(np.asarray(state["V"]), np.asarray(state["class_ids"]))
    clip = np.eye(learned.shape[0])

    def label(c: int) -> str:
        return names.get(c, f"class {c}") if names else f"class {c}"

    def frame(matrix: np.ndarray) -> pd.DataFrame:
        rows = []
        for i, r in enumerate(classes):
            shown = matrix[r, classes]
            for j, c in enumerate(classes):
                rows.append((label(r), label(c), float(shown[j]), i, j))
            rows.append((label(r), OTHER, float(max(0.0, np.nansum(matrix[r]) - np.nansum(shown))), i, len(classes)))
        return pd.DataFrame(rows, columns=["embedding_class", "class", "prior", "rank_row", "rank_col"])

    return frame(learned), frame(clip)


def prior_summary(state: Mapping[str, np.ndarray], n2: float | None, classes: list[int]) -> pd.DataFrame:
    """Per shown class: prior updates, mass kept on the own class (CLIP: 1), largest other class and its mass."""
    learned = class_prior(np.asarray(state["V"]), np.asarray(state["class_ids"]))
    updates = prior_updates(state, n2)
    rows = []
    for c in classes:
        row = learned[c].copy()
        own = row[c]
        row[c] = -np.inf
        other = int(np.argmax(row))
        rows.append({"class": c, "prior updates": float(updates[c]), "P(own class)": float(own),
                     "top other class": other, "P(top other)": float(row[other])})
    return pd.DataFrame(rows)
