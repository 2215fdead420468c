"""O-TPT's card: TPT's context tuning with an orthogonality penalty on the class text features (calibration), reset
every sample."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tpt.card import KEEP, LR, PROMPT_WORDS, STEPS, TEXT
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        "otpt", "O-TPT", 142, "prompt", "TPT's context tuning plus lambda times the class text features' departure "
        "from orthogonality (calibration), reset every sample (episodic; CLIP's text encoder runs at test time)",
        "orchestrator.methods.otpt.method:OTPT",
        (LR, STEPS, KEEP,
         HParam("lambda_term", "float", 18.0, "weight of the orthogonality term added to the entropy: the mean over "
                "classes of |row of the text features' Gram matrix| - 1 (--lambda_term)", "weight", low=0.0,
                per_dataset=dict.fromkeys(("imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
                                          2.0)),
         LOGIT_SCALE),
        inputs="views", views=Views("augmix"), text_encoder=TEXT, cost=Cost(state_words=PROMPT_WORDS),
        source="ashshaksharifdeen/O-TPT@a09933f otpt_classification.py (test_time_tuning, run_type tpt_otpt: the "
               "Householder term), clip/custom_clip_iptp_bas.py (get_text_features, textfeatures_); "
               "scripts/test_tpt_otpt_fg.sh (lambda 18) and test_tpt_otpt_ds.sh (lambda 2, --I_augmix: AugMix views "
               "on ImageNet and its variants too)",
        lockstep=Lockstep("orchestrator.methods.episodic:run_episodic_lockstep")),
)
