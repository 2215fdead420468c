"""OGA's card: a Gaussian model of the features (class means, one shared covariance) fitted on a memory of
low-entropy samples, updated on batches of 32 before each batch is predicted."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, MethodCard

# The official estimators of the inverse covariance (OGA_core.py GaussAdapt sig_type), in its spelling's order.
COV_ESTIMATORS = ("ridge_moore_penrose", "ridge", "moore_penrose")

CARDS = (
    MethodCard(
        "oga", "OGA", 75, "gaussian", "Gaussian class means + shared covariance from a low-entropy memory (per batch)",
        "orchestrator.methods.oga.method:OGA",
        (HParam("map_tau", "float", 0.05, "temperature of the Gaussian log-likelihoods in the MAP estimate "
                "(the official tau)", "scale", low=0.0, low_open=True, log=True),
         HParam("shot_capacity", "int", 8, "memory slots per class (lowest zero-shot entropy kept)", "size", low=1),
         HParam("cov_estimator", "str", "ridge_moore_penrose", "inverse covariance: ridge_moore_penrose = the "
                "Bayes-ridge estimate while n <= 4d samples are stored, the pseudo-inverse after (official default); "
                "ridge = always the ridge estimate; moore_penrose = always the pseudo-inverse", "choice",
                choices=COV_ESTIMATORS),
         HParam("normalize_mu", "bool", False, "L2-normalise the class means after each update (official option, "
                "off by default)", "flag"),
         LOGIT_SCALE,
         HParam("state_dtype", "str", "float32", "dtype of the memory and its entropies: float32 (default: "
                "float16's rounding belongs to the dtype, not the method) or float16 as the official code "
                "(OGA_core.py GaussAdapt: a sample is kept only below a stored entropy's float16 value)", "choice",
                choices=("float32", "float16"))),
        state=("mus", "inv_sigma", "memory_filled", "memory_entropy"),
        # memory [K, slots, d] with its entropies and bool fill flags, the inverse covariance [d, d], means and
        # prototypes [K, d] (float16: the memory and its entropies take half of this)
        cost=Cost(samples_per_s=201.0, gpu_samples_per_s=11896.0,
                  state_words="K*shot_capacity*d + 1.25*K*shot_capacity + d*d + 2*K*d"),
        source="cfuchs2023/OGA@26b6010 (OGA/OGA_core.py GaussAdapt; runner.py: update_memory on the batch, then "
               "get_log_probs and get_MAP with simplex_p=True; main.py defaults: batch 32, shot_capacity 8, tau 0.05, "
               "RidgeMoorePenrose, normalize_mu False, the same for every dataset)", batch_size=32),
)
