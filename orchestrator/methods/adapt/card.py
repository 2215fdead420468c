"""ADAPT's card (online mode): Gaussian class means from per-class knowledge banks and one shared covariance, fused
with CLIP's logits; its per-dataset fusion scale (data/cls_to_names.py custom_scale)."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, MethodCard, Views

# AIM-SKKU/ADAPT data/cls_to_names.py custom_scale, keyed by the project's dataset names
_SCALE = {
    "imagenet": 20.0, "imagenet-sketch": 20.0, "imagenet-v2": 30.0, "imagenet-a": 40.0, "imagenet-r": 100.0,
    "pets": 100.0, "eurosat": 100.0, "aircraft": 100.0, "food101": 100.0, "caltech101": 100.0,
    "flowers102": 60.0, "cars": 60.0, "dtd": 60.0, "sun397": 60.0, "ucf101": 70.0,
}
CARDS = (
    MethodCard(
        "adapt", "ADAPT", 190, "gaussian",
        "Gaussian class means from per-class knowledge banks of confident samples, one shared covariance "
        "(ridge-regularised), fused with CLIP's logits",
        "orchestrator.methods.adapt.method:ADAPT",
        (
            HParam("bank_size", "int", 16, "knowledge-bank entries per class (--bank_size, L)", "size", low=1),
            HParam("mean_alpha", "float", 0.9, "weight of the bank's mean against the text embedding in a class "
                   "mean (--alpha)", "weight", low=0.0, high=1.0),
            HParam("fusion_scale", "float", 20.0, "temperature of the fusion: CLIP's logits times exp((log p_GDA + "
                   "fusion_scale / (2M) * bank logits - max) / fusion_scale) (custom_scale)", "scale", low=0.0,
                   low_open=True, per_dataset=_SCALE),
            HParam("keep", "float", 0.1, "fraction of lowest-entropy views kept (ImageNet's variants)", "threshold",
                   low=0.0, high=1.0, low_open=True),
            LOGIT_SCALE,
        ),
        inputs="views", views=Views("crops", scope="protocol"),
        state=("bank_keys", "bank_labels", "bank_probs", "bank_loss", "means", "weights", "bias"),
        # the banks [K L, d], int64 labels [K L], their probabilities [K L, K] and losses [K L]; the means [K, d], the
        # text [K, d], the GDA weights [d, K] and bias [K]; the last update's similarities [K L]
        cost=Cost(samples_per_s=28.0, state_words="K*bank_size*d + 2*K*bank_size + K*bank_size*K + K*bank_size + 2*K*d + d*K + K "
                              "+ K*bank_size"),
        source="AIM-SKKU/ADAPT@68481c0 ADAPT_online.py (evaluation, update_knowledge_banks, param_estimation, "
               "compute_final_prediction, get_clip_feature_logits), data/cls_to_names.py (custom_scale), "
               "scripts/ADAPT_online_TTA.sh (bank_size 16, alpha 0.9); views: data/datautils.py:33-50 "
               "build_test_loader, 63 random resized crops + flips on ImageNet-A/-V2/-R/-Sketch (get_ood_preprocess), "
               "clip.load's preprocess on ImageNet and the cross-domain sets"),
)
