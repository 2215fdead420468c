"""A-TPT's card: TPT's context tuning with an angular-diversity term on the class text features (calibration), reset
every sample."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tpt.card import KEEP, LR, PROMPT_WORDS, STEPS, TEXT
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        "atpt", "A-TPT", 143, "prompt", "TPT's context tuning minus lambda times the class text features' angular "
        "diversity, the mean angle to each class's nearest other class (calibration), reset every sample "
        "(episodic; CLIP's text encoder runs at test time)",
        "orchestrator.methods.atpt.method:ATPT",
        (LR, STEPS, KEEP,
         HParam("lambda_term", "float", 80.0, "weight of the angular diversity in the loss (--lambda_term)", "weight",
                low=0.0,
                per_dataset=dict.fromkeys(("imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
                                          10.0)),
         HParam("tau_term", "float", 0.99999, "clamp of the nearest class's cosine before its arccos (--tau_term)",
                "threshold", low=0.0, high=1.0, low_open=True),
         HParam("direction", "str", "maximise", "maximise the angular diversity (the paper, and "
                "tpt_classification.py, which the ImageNet script runs) or minimise it (atpt_classification.py, "
                "which the fine-grained script runs, adds the term with the opposite sign)", "choice",
                choices=("maximise", "minimise")),
         LOGIT_SCALE),
        inputs="views", views=Views("augmix"), text_encoder=TEXT, cost=Cost(state_words=PROMPT_WORDS),
        source="MB-Shihab-Aaqil-Ahamed/A-TPT@d76ecf6 tpt_classification.py and atpt_classification.py "
               "(test_time_tuning, run_type tpt_atpt), clip/custom_clip.py (ang_norm_cal); "
               "scripts/test_tpt_atpt_fg.sh (lambda 80) and test_tpt_atpt_ds.sh (lambda 10, --I_augmix: AugMix views "
               "on ImageNet and its variants too); tau_term 0.99999 in both",
        lockstep=Lockstep("orchestrator.methods.episodic:run_episodic_lockstep")),
)
