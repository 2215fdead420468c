"""DynaPrompt's card: an online buffer of prompts, those chosen for a sample tuned on it and kept for the next."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tpt.card import KEEP, LR, PROMPT_WORDS, STEPS, TEXT
from orchestrator.registry.card import Cost, HParam, MethodCard, Views

CARDS = (
    MethodCard(
        "dynaprompt", "DynaPrompt", 143, "prompt", "a buffer of 12 prompts carried along the stream: per sample the "
        "fresh prompt and the buffer's prompts chosen by entropy and probability difference take one AdamW step "
        "and predict; once all are used the least recently chosen is replaced by a fresh one (online; CLIP's text "
        "encoder runs at test time)",
        "orchestrator.methods.dynaprompt.method:DynaPrompt",
        (LR, STEPS, KEEP,
         HParam("prompts", "int", 12, "prompts in the online buffer (--num_prompts)", "size", low=2),
         HParam("selection", "str", "code", "which buffer prompts join the fresh one: code = the official rank rule "
                "(it indexes the entropy ranking by prompt ids), intended = the prompts whose entropy is below and "
                "whose probability difference is above the fresh prompt's", "choice", choices=("code", "intended")),
         LOGIT_SCALE),
        inputs="views", views=Views("augmix", groups={"ood": "crops"}),
        # its step backpropagates through the chosen prompts a block at a time, from one prompt up: TPT's memory;
        # its state: TPT's class prompts and the buffer's context offsets [prompts, 4, w]
        text_encoder=TEXT, cost=Cost(state_words=PROMPT_WORDS + " + prompts*4*w"),
        source="zzzx1224/DynaPrompt@acd33cf dynap_classification.py (test_time_tuning, test_time_adapt_eval), "
               "clip/custom_clip_lessctx.py (PromptLearner with num_p prompts, ctx_order, ctx_use), run_dynap.sh and "
               "scripts/test_dynap.sh (num_p 12, lr 5e-3, 64 views, --selection_p 0.1); views: AugMixAugmenter("
               "n_views=batch_size - 1, augmix=len(set_id) > 1): crops on ImageNet and its variants, AugMix on the "
               "cross-domain sets"),
)
