"""RLCF's card: TPT's context tuning on a CLIP teacher's reward (the CLIPScore of the student's top-K classes on the
confident views, minus its mean), reset every sample."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tpt.card import KEEP, PROMPT_WORDS, STEPS, TEXT
from orchestrator.registry.backbones import BACKBONES, SOFTMAX
from orchestrator.registry.card import Cost, HParam, MethodCard, Views
from orchestrator.registry.dataset_card import CROSS_DOMAIN
from orchestrator.registry.datasets import group_datasets

# The teachers a run may name: the registry's CLIP backbones (their published weights, found as the student's are)
# and the two toy-size test configs of orchestrator.clip.testing (random weights), for tests and smoke runs.
TEACHERS = (*(b.model for b in BACKBONES.values() if b.head == SOFTMAX), "bca-tiny-vit", "bca-tiny-rn")

CARDS = (
    MethodCard(
        "rlcf", "RLCF", 145, "prompt", "the prompt's 4 context tokens, AdamW steps per sample on a CLIP teacher's "
        "reward: the CLIPScore of the student's top-K classes on the confident views minus its mean, times their "
        "cross-entropy, reset every sample (episodic; CLIP's text encoder runs at test time, the teacher's features "
        "come from the feature cache)",
        "orchestrator.methods.rlcf.method:RLCF",
        (HParam("lr", "float", 7e-3, "AdamW learning rate of the context tokens (--lr; 7e-3 in both scripts)", "rate",
                low=0.0, low_open=True, log=True),
         HParam(STEPS.name, STEPS.kind, 3, "AdamW steps on the context per sample (--tta_steps: 3 on ImageNet and its "
                "variants, 5 on the cross-domain sets)", STEPS.role, low=1,
                per_dataset=dict.fromkeys(group_datasets(CROSS_DOMAIN), 5)),
         KEEP,
         HParam("weight_decay", "float", 5e-4, "AdamW weight decay of the context (--weight_decay)", "rate", low=0.0),
         HParam("sample_k", "int", 3, "classes sampled per confident view: the student's top-K, each rewarded by the "
                "teacher (--sample_k)", "count", low=1),
         HParam("teacher", "str", "ViT-L-14", "the CLIP backbone that rewards (--reward_arch): a registered CLIP "
                "backbone at its published weights, or a toy-size test config (random weights); its features of the "
                "same images and views come from the feature cache", "choice", choices=TEACHERS),
         LOGIT_SCALE),
        inputs="views", views=Views("augmix", groups={"ood": "crops"}), text_encoder=TEXT,
        cost=Cost(state_words=PROMPT_WORDS),
        source="mzhaoshuai/RLCF@0996a5d TPT/tpt_cls_rl.py (test_time_tuning, test_time_adapt_eval), "
               "TPT/clip_reward.py (CLIPRewards: CLIPScore, rewards_post_process); scripts/rlcf-prompt.sh (ImageNet "
               "and its variants: 3 steps) and rlcf-prompt-fine.sh (cross-domain: 5 steps), lr 7e-3, weight decay "
               "5e-4, sample_k 3, ViT-L/14 reward; views as TPT's (AugMixAugmenter: crops on ImageNet and its "
               "variants, AugMix on the cross-domain sets)"),
)
