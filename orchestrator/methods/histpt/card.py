"""HisTPT's card: the prompt's context carried along the stream, tuned on the pseudo-labels of three memories of its
past text features (local, hard-sample, global)."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tpt.card import KEEP, LR, PROMPT_WORDS, STEPS, TEXT
from orchestrator.registry.card import Cost, HParam, MethodCard, Views

CARDS = (
    MethodCard(
        "histpt", "HisTPT", 144, "prompt", "the prompt's context carried along the stream: per sample one AdamW step "
        "on the confident views' cross-entropy against the label three memories of its past text features agree "
        "on (the last 32, the hardest, and their moving average; online; CLIP's text encoder runs at test time)",
        "orchestrator.methods.histpt.method:HisTPT",
        (LR, STEPS, KEEP,
         HParam("memory_size", "int", 32, "entries of the local and the hard-sample memory (the official "
                "memory_local and memory_hard, 32)", "size", low=1),
         HParam("hard_top", "int", 16, "highest-entropy local entries a hard-sample entry averages (the official "
                "topk, 16); at most memory_size", "count", low=1),
         HParam("ema_momentum", "float", 0.99, "momentum of the global memory's moving average (the official 0.99)",
                "rate", low=0.0, high=1.0),
         LOGIT_SCALE),
        inputs="views", views=Views("augmix", groups={"ood": "crops"}),
        # TPT's class prompts; the context, AdamW's two moments [4, w] and step; the local and hard memories
        # [memory_size, K, d], the global one [K, d] and the local entries' entropies; a step's activations are TEXT's
        text_encoder=TEXT,
        cost=Cost(state_words=PROMPT_WORDS + " + 3*4*w + 1 + (2*memory_size + 1)*K*d + memory_size"),
        source="jingyi0000/HisTPT@aaf5479 (the segmentation port: modeling/language/vlpencoder.py update_st_memory, "
               "update_hard_memory, update_ema_prompt; modeling/architectures/seem_model_v1.py forward_seg_coop: the "
               "memories, their sizes and momentum, the update order and the fused pseudo-label; no classification "
               "code released), on TPT's classification path (azshue/TPT@16e2967: views, context, AdamW, confident "
               "views) as TTABC's port runs it (walawalagoose/TTABC ttabc/model_selection/histpt.py: the context and "
               "optimiser never reset); views: TPT's AugMixAugmenter rule, crops on ImageNet and its variants, "
               "AugMix on the cross-domain sets"),
)
