"""Which settings matter: hyperparameter importance per method, by scikit-learn.

A random forest is fitted to a metric over one method's finished runs (the hyperparameters that vary as
features, plus the dataset and backbone where several appear, so a dataset effect is not credited to an
hparam), and the importance of a feature is sklearn's permutation importance: how much the forest's R² drops
when that column is shuffled, mean ± std over repeats. With a handful of runs these numbers are rough; the
caption says how many runs each rests on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

# Below this many runs a forest has nothing to learn from.
MIN_RUNS = 6
_CONTEXT = ("dataset", "backbone")


def varying(runs: pd.DataFrame, columns: Sequence[str]) -> list[str]:
    """The columns that take more than one value among `runs`."""
    return [c for c in columns if c in runs.columns and runs[c].nunique(dropna=True) > 1]


def features(runs: pd.DataFrame, hparams: Sequence[str]) -> pd.DataFrame:
    """The design matrix: varying numeric hparams as they are (a forest's splits do not change under a log
    rescaling), categorical ones and the context (dataset, backbone) as integer codes."""
    out = pd.DataFrame(index=runs.index)
    for c in [*varying(runs, hparams), *varying(runs, _CONTEXT)]:
        column = runs[c]
        if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
            out[c] = column.astype(float).fillna(-1.0)
        else:
            out[c] = pd.Categorical(column.astype(str)).codes.astype(float)
    return out


def hparam_importance(runs: pd.DataFrame, hparams: Sequence[str], metric: str, seed: int = 0,
                      repeats: int = 5) -> pd.DataFrame:
    """Permutation importance of each varying setting for `metric` over `runs` (one method's finished runs):
    columns setting, importance, std. Empty when fewer than MIN_RUNS runs or nothing varies."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.inspection import permutation_importance

    usable = runs[runs[metric].notna()]
    x = features(usable, hparams)
    if len(usable) < MIN_RUNS or x.shape[1] == 0:
        return pd.DataFrame(columns=["setting", "importance", "std"])
    y = usable[metric].astype(float).to_numpy()
    forest = RandomForestRegressor(n_estimators=100, min_samples_leaf=1, random_state=seed, n_jobs=1)
    forest.fit(x.to_numpy(), y)
    if np.ptp(y) == 0:  # a constant metric: nothing to explain
        scores = np.zeros(x.shape[1]), np.zeros(x.shape[1])
    else:
        result = permutation_importance(forest, x.to_numpy(), y, n_repeats=repeats, random_state=seed, n_jobs=1)
        scores = result.importances_mean, result.importances_std
    out = pd.DataFrame({"setting": list(x.columns), "importance": scores[0], "std": scores[1]})
    return out.sort_values("importance", ascending=False, kind="stable").reset_index(drop=True)
