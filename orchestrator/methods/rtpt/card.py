"""R-TPT's card: the context tuned on the confident views' mean entropy, the prediction a reliability-weighted
ensemble of the tuned views, reset every sample."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tpt.card import KEEP, LR, PROMPT_WORDS, STEPS, TEXT
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        "rtpt", "R-TPT", 142, "prompt", "the prompt's context tuned on the confident views' mean entropy; the "
        "prediction a reliability-weighted mean of every tuned view, reset every sample (episodic; CLIP's text "
        "encoder runs at test time)",
        "orchestrator.methods.rtpt.method:RTPT",
        (LR, STEPS, KEEP,
         HParam("neighbours", "int", 20, "nearest views whose mean similarity scores a view's reliability (get_top_sim's k)",
                "count", low=1),
         HParam("reliability_temp", "float", 0.01, "temperature of the softmax over the views' reliability scores",
                "scale", low=0.0, low_open=True, log=True),
         HParam("exclude", "str", "self", "what a view's neighbours leave out: self = the view itself (the paper, and "
                "the code's evident intent), code = similarities >= 1.0 (the code's literal mask, which keeps a view's "
                "own similarity wherever rounding puts it below 1)", "choice", choices=("self", "code")),
         LOGIT_SCALE),
        inputs="views", views=Views("augmix", groups={"ood": "crops"}), text_encoder=TEXT,
        cost=Cost(gpu_samples_per_s=1.93, state_words=PROMPT_WORDS),
        source="TomSheng21/R-TPT@961483d rtpt.py (test_time_tuning, entropy_avg, get_top_sim, test_time_adapt_eval); "
               "views: AugMixAugmenter(n_views=batch_size - 1, augmix=len(dset) > 1): crops on ImageNet and its "
               "variants, AugMix on the cross-domain sets",
        lockstep=Lockstep("orchestrator.methods.episodic:run_episodic_lockstep")),
)
