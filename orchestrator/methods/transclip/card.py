"""TransCLIP's card (zero-shot, per batch as StatA compares it), and the hparams StatA shares with it."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, MethodCard, Views

# StatA's online comparison: batches of 128 in its README's table and script/StatA_online.sh, the default here;
# upstream is ambiguous, main.py's --batch_size default and one README command say 64
STATA_BATCH = 128
# StatA's loader (datasets/__init__.py get_all_dataloaders) feeds clip.load's preprocess on every dataset, the
# ImageNet variants included: one view where the other single-feature methods get AugMix's confident mean
STATA_SINGLE_VIEW = ("imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch")
TRANSDUCTIVE = (
    HParam("lambda_y_hat", "float", 1.0, "exponent of the zero-shot posterior in the z update (the text term)",
           "weight", low=0.0),
    HParam("lambda_laplacian", "float", 1.0, "weight of the kNN Laplacian term in the z update", "weight", low=0.0),
    HParam("n_neighbors", "int", 3, "nearest samples of the batch in the affinity graph (at most b - 1)", "count",
           low=1),
    HParam("max_iter", "int", 10, "outer iterations (z, then mu and sigma); z is updated max_iter + 1 times",
           "count", low=0),
    LOGIT_SCALE,
)
# what every per-batch card of StatA's comparison shares: no state between batches but the text embeddings, batches
# of 128, StatA's single-view datasets
PER_BATCH = dict(views=Views(single_datasets=STATA_SINGLE_VIEW), batch_size=STATA_BATCH, state=())
PER_BATCH_WORDS = "K*d"

CARDS = (
    MethodCard(
        "transclip", "TransCLIP", 150, "transductive",
        "nothing kept: each batch solved alone (Gaussian + kNN Laplacian + text term)",
        "orchestrator.methods.transclip.method:TransCLIP",
        (HParam("mu_init", "str", "text", "initial class means: text (the text embeddings, StatA's solver) or "
                "confident (each class's 8 most confident samples, TransCLIP's own code)", "choice",
                choices=("text", "confident")), *TRANSDUCTIVE),
        **PER_BATCH, cost=Cost(samples_per_s=138.0, gpu_samples_per_s=8012.0, state_words=PER_BATCH_WORDS),
        source="MaxZanella/StatA@eea8637 solvers/TransCLIP.py, main.py get_hp (as StatA compares it; "
               "MaxZanella/transduction-for-vlms@6a9e8f3 TransCLIP_solver is the original, means from confident "
               "samples)"),
)
