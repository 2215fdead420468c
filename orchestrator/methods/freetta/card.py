"""FreeTTA's card: Gaussian class statistics (means, counts, one shared covariance) estimated by an online EM whose
E-step takes CLIP's zero-shot prediction as the prior; written from the paper (no official code was found)."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, MethodCard

# The paper's alpha and beta were not at hand. Secondary accounts of it (a summary of the paper, a course
# reimplementation) give one pair for every dataset, alpha 0.2 and beta 4.5; they are not taken here because they
# act on scalings this reconstruction cannot confirm (whether CLIP's probabilities are taken at the logit scale, the
# covariance update). These defaults are set by the scales the two act on: alpha = 0.1 lets the discriminant's
# logits, which grow to tens once the shared covariance has shrunk to the classes' spread, move CLIP's logits (of a
# few units between classes) without drowning them; beta = 1 weighs a sample of entropy 1 nat by 1/e.
_NOT_THE_PAPERS = " (not the paper's value, which was not at hand; grid it)"

CARDS = (
    MethodCard(
        "freetta", "FreeTTA", 200, "gaussian",
        "Gaussian class means, counts and one shared covariance by online EM, each sample weighted by CLIP's "
        "confidence, fused with CLIP's logits (from the paper)",
        "orchestrator.methods.freetta.method:FreeTTA",
        (
            HParam("alpha", "float", 0.1, "weight of the discriminant's logits added to CLIP's" + _NOT_THE_PAPERS,
                   "weight", low=0.0),
            HParam("beta", "float", 1.0, "sharpness of a sample's EM weight exp(-beta H), H the entropy (nats) of "
                   "CLIP's prediction" + _NOT_THE_PAPERS, "scale", low=0.0),
            LOGIT_SCALE,
        ),
        state=("means", "counts", "total", "covariance"),
        # the means [K, d], counts [K], the total weight t and the shared covariance [d, d]; the text [K, d]
        cost=Cost(samples_per_s=42.0, state_words="2*K*d + K + 1 + d*d"),
        source="from the paper: Dai & Yang, CVPR 2025, \"Free on the Fly: Enhancing Flexibility in Test-Time "
               "Adaptation with Online EM\" (arXiv 2507.06973), reconstructed from its abstract (Gaussian "
               "discriminant analysis, online EM with the zero-shot prior, entropy weighting, fusion): its method "
               "section was not at hand and no official code was found, so the equations are unconfirmed"),
)
