"""SAR's card: sharpness-aware, reliable entropy minimisation on the image encoder's norm layers, with model
recovery."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tent.card import EPISODIC, NORM_STEP, PRECISION, STEPS
from orchestrator.registry.card import HParam, ImageEncoderUse, MethodCard

CARDS = (
    MethodCard(
        "sar", "SAR", 171, "encoder", "the image encoder's norm-layer affine parameters below its top blocks, one "
        "sharpness-aware SGD step per batch on the entropy of its reliable samples (entropy < 0.4 ln K), reset to "
        "the initial weights when the moving average of that loss falls below 0.2",
        "orchestrator.methods.sar.method:SAR",
        (HParam("lr", "float", 1e-3, "SGD learning rate (main.py for ViT-Base: 0.001 / 64 * batch size)", "rate",
                low=0.0, low_open=True, log=True),
         HParam("margin", "float", 0.4, "reliable samples: entropy below margin * ln K (--sar_margin_e0 = "
                "0.4 * ln 1000)", "threshold", low=0.0, low_open=True),
         HParam("reset_constant", "float", 0.2, "model recovery: reset when the moving average of the reliable "
                "loss falls below it (reset_constant_em)", "threshold", low=0.0),
         HParam("rho", "float", 0.05, "SAM's neighbourhood radius (sam.py's default)", "rate", low=0.0),
         STEPS, EPISODIC, PRECISION, LOGIT_SCALE),
        batch_size=64, image_encoder=ImageEncoderUse("norm", "episodic", NORM_STEP),
        source="mr-eggplant/SAR@492c1ad sar.py (SAR.forward, forward_and_adapt_sar, update_ema, collect_params, "
               "configure_model), sam.py (SAM, rho 0.05), main.py (SGD momentum 0.9, lr 0.001 / 64 * bs for "
               "ViT-Base, test_batch_size 64, margin 0.4 ln 1000)"),
)
