"""TPT's card: the prompt's context tuned per sample by CLIP's text encoder, reset every sample."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, TextEncoderUse, Views

# The hparams TPT, C-TPT and R-TPT share (their official scripts' defaults: tpt_classification.py's argparse).
LR = HParam("lr", "float", 5e-3, "AdamW learning rate of the context tokens (--lr)", "rate", low=0.0, low_open=True,
            log=True)
STEPS = HParam("steps", "int", 1, "AdamW steps on the context per sample (--tta_steps)", "count", low=1)
KEEP = HParam("keep", "float", 0.1, "fraction of lowest-entropy views in the loss (--selection_p): int(V keep) of "
              "V views, as the official code counts them; a run where that is none is refused (the official code "
              "would not tune)", "rate", low=0.0, high=1.0, low_open=True)
# Activation memory of one sample's tuning step per class, float32, at the text tower of ViT-B/16 and RN50
# (width 512, 12 layers, 77 tokens): TextTower.saved_bytes_per_prompt, as `python -m benchmarks.prompt` prints it.
TEXT = TextEncoderUse(device="gpu", mb_per_class=18.2)
# the class prompts' token embeddings [K, 77, w] (prefix and suffix of the context), the initial context [4, w],
# the int64 end-of-text positions [K] and the initial text features [K, d] (w = d in ViT-B/16's text tower, half d
# in RN50's); a step's activations are TEXT's
PROMPT_WORDS = "77*K*w + 4*w + K*d + 2*K"

CARDS = (
    MethodCard(
        "tpt", "TPT", 140, "prompt", "the prompt's 4 context tokens, one AdamW step per sample on the confident "
        "views' entropy, reset every sample (episodic; CLIP's text encoder runs at test time)",
        "orchestrator.methods.tpt.method:TPT", (LR, STEPS, KEEP, LOGIT_SCALE),
        inputs="views", views=Views("augmix", groups={"ood": "crops"}), text_encoder=TEXT,
        cost=Cost(gpu_samples_per_s=1.91, state_words=PROMPT_WORDS),
        source="azshue/TPT@16e2967 tpt_classification.py (test_time_tuning, test_time_adapt_eval), "
               "clip/custom_clip.py (PromptLearner, TextEncoder); views: AugMixAugmenter(n_views=batch_size - 1, "
               "augmix=len(set_id) > 1): crops on ImageNet and its variants, AugMix on the cross-domain sets",
        lockstep=Lockstep("orchestrator.methods.episodic:run_episodic_lockstep")),
)
