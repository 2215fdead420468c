"""PromptAlign's card: MaPLe's prompts tuned per sample in both towers, on the confident views' entropy and the
alignment of their token statistics with the source's, reset every sample."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tent.card import NORM_STEP, PRECISION
from orchestrator.methods.tpt.card import TEXT
from orchestrator.registry.card import HParam, ImageEncoderUse, MethodCard, Views

CARDS = (
    MethodCard(
        "promptalign", "PromptAlign", 145, "prompt", "MaPLe's prompts in both towers, one AdamW step per sample on "
        "the confident views' entropy plus the alignment of their token means and variances with the source's, reset "
        "every sample (episodic; both towers run at test time; needs a MaPLe context)",
        "orchestrator.methods.promptalign.method:PromptAlign",
        (HParam("lr", "float", 4e-2, "AdamW learning rate of the prompts (TPT.LR)", "rate", low=0.0, low_open=True,
                log=True),
         HParam("steps", "int", 1, "AdamW steps on the prompts per sample (TPT.TTA_STEPS)", "count", low=1),
         HParam("keep", "float", 0.1, "fraction of lowest-entropy views in the entropy loss (TPT.TPT_THRESHOLD)",
                "rate", low=0.0, high=1.0, low_open=True),
         HParam("align_keep", "float", 0.1, "fraction of lowest-entropy views whose token statistics are aligned "
                "(TPT.ALIGN_THRESHOLD)", "rate", low=0.0, high=1.0, low_open=True),
         HParam("align_weight", "float", 100.0, "weight of the distribution alignment, divided by align_to - "
                "align_from (TPT.DISTR_LOSS_W); 0: MaPLe + TPT, no source statistics needed", "weight", low=0.0),
         HParam("align_from", "int", 0, "first vision block aligned (TPT.ALIGN_LAYER_FROM)", "count", low=0),
         HParam("align_to", "int", 3, "TPT.ALIGN_LAYER_TO: the blocks aligned are align_from .. align_to - 2 (the "
                "official range(from, to - 1)) and the weight is divided by align_to - align_from", "count", low=1),
         PRECISION, LOGIT_SCALE),
        inputs="views", views=Views("crops"),
        # its step back-propagates through every block of the vision tower as a norm-layer step does (its 2 prompt
        # tokens add under 0.1 MB at ViT-B/16), and through the text tower's K class prompts from the first layer's
        # tokens, as TPT's (tests/test_encoder_methods.py holds it)
        image_encoder=ImageEncoderUse("prompts", True, NORM_STEP, device="gpu", text_tower=True,
                                      text_mb_per_class=TEXT.mb_per_class),
        source="jameelhassan/PromptAlign@9290564 trainers/prompt_align.py (MultiModalPromptLearner.reset, "
               "test_time_adapt_eval, test_time_tuning, select_confident_samples, avg_entropy, distr_align_loss, "
               "AugMixAugmenter), clip/model.py (ResidualAttentionBlock_MaPLe.visual_feat, VisionTransformer_MaPLe), "
               "configs/trainers/PromptAlign/*.yaml and train.py (TPT.*: LR 4e-2, TTA_STEPS 1, TPT_THRESHOLD 0.1, "
               "ALIGN_THRESHOLD 0.1, DISTR_LOSS_W 100, ALIGN_LAYER_FROM 0, ALIGN_LAYER_TO 3, BATCH_SIZE 64 views)"),
)
