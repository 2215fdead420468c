"""C-TPT's card: TPT's context tuning with a text-feature dispersion term (calibration), reset every sample."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tpt.card import KEEP, LR, PROMPT_WORDS, STEPS, TEXT
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        "ctpt", "C-TPT", 141, "prompt", "TPT's context tuning plus lambda times the class text features' dispersion "
        "(calibration), reset every sample (episodic; CLIP's text encoder runs at test time)",
        "orchestrator.methods.ctpt.method:CTPT",
        (LR, STEPS, KEEP,
         HParam("lambda_term", "float", 50.0, "weight of the average text feature dispersion subtracted from the "
                "entropy (--lambda_term)", "weight", low=0.0,
                per_dataset=dict.fromkeys(("imagenet", "imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"),
                                          20.0)),
         LOGIT_SCALE),
        inputs="views", views=Views("augmix"), text_encoder=TEXT,
        cost=Cost(gpu_samples_per_s=1.93, state_words=PROMPT_WORDS),
        source="hee-suk-yoon/C-TPT@085e6c2 tpt_classification.py (test_time_tuning, run_type tpt_ctpt), "
               "clip/custom_clip.py (l2_norm_mean_training); scripts/test_tpt_ctpt_fg.sh (lambda 50) and "
               "test_tpt_ctpt_ds.sh (lambda 20, --I_augmix: AugMix views on ImageNet and its variants too)",
        lockstep=Lockstep("orchestrator.methods.episodic:run_episodic_lockstep")),
)
