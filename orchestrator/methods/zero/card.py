"""Zero's card: a majority vote of the confident augmented views, nothing kept between samples."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        "zero", "Zero", 60, "zero", "nothing: majority vote of the confident augmented views",
        "orchestrator.methods.zero.method:Zero",
        (HParam("keep", "float", 0.3, "fraction of the views kept (lowest entropy; the official gamma)", "rate",
                low=0.0, high=1.0, low_open=True),
         HParam("tie_break", "str", "after_k", "a tied vote: after_k = the first view from index int(V keep) on, in "
                "the loader's order, voting a tied class (official code: greedy_break(ties, l[k:])), discarded = the "
                "first discarded view in confidence order voting one, mean_prob = the higher mean probability of the "
                "kept views", "choice", choices=("after_k", "discarded", "mean_prob")), LOGIT_SCALE,
         HParam("state_dtype", "str", "float32", "dtype of the features and logits: float32 (default: float16's "
                "rounding belongs to the dtype, not the method) or float16 as the official code (half CLIP under "
                "autocast, its zero temperature float16's eps: soft votes)", "choice", choices=("float32", "float16"))),
        inputs="views", views=Views("crops"),
        cost=Cost(samples_per_s=6064.0, gpu_samples_per_s=83128.0, state_words="0"),
        source="FarinaMatteo/zero (ttas/zero.py); views: data/augs.py:57-67 get_transforms gives every dataset "
               "MultiViewCropAndFlip (data/augs.py:43, 63 random resized crops + flips and the original)",
        lockstep=Lockstep("orchestrator.methods.episodic:run_episodic_lockstep")),
)
