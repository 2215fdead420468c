"""DeYO's card: entropy minimisation on the image encoder's norm layers over the samples whose prediction a patch
shuffle breaks (PLPD), reweighted by entropy and PLPD."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tent.card import NORM_STEP, PRECISION, STEPS
from orchestrator.registry.card import HParam, ImageEncoderUse, MethodCard

CARDS = (
    MethodCard(
        "deyo", "DeYO", 172, "encoder", "the image encoder's norm-layer affine parameters below its top blocks, one "
        "SGD step per batch on the entropy of the samples that are confident (entropy < 0.5 ln K) and whose "
        "prediction a 4x4 patch shuffle lowers by more than 0.2 (PLPD), weighted by both, carried along the stream",
        "orchestrator.methods.deyo.method:DeYO",
        (HParam("lr", "float", 1e-3, "SGD learning rate (main.py for ViT-Base: 0.001 / 64 * batch size)", "rate",
                low=0.0, low_open=True, log=True),
         HParam("margin", "float", 0.5, "confident samples: entropy below margin * ln K (--deyo_margin)",
                "threshold", low=0.0, low_open=True),
         HParam("margin_e0", "float", 0.4, "the entropy weight's margin, margin_e0 * ln K (--deyo_margin_e0)",
                "threshold", low=0.0),
         HParam("plpd_threshold", "float", 0.2, "samples whose true-class probability the shuffle lowers by more "
                "than this (--plpd_threshold)", "threshold"),
         HParam("patch_len", "int", 4, "patches per row and column of the shuffle (--patch_len)", "count", low=1),
         STEPS, PRECISION, LOGIT_SCALE),
        batch_size=64, image_encoder=ImageEncoderUse("norm", False, NORM_STEP),
        source="Jhyun17/DeYO@35ce821 methods/deyo.py (forward_and_adapt_deyo, collect_params, configure_model), "
               "config.py (aug_type patch, patch_len 4, deyo_margin 0.5, deyo_margin_e0 0.4, plpd_threshold 0.2, "
               "filter and reweight on, test_batch_size 64), main.py (SGD momentum 0.9, lr 0.001 / 64 * bs for "
               "ViT-Base)"),
)
