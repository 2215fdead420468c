"""Tent's card: entropy minimisation on the image encoder's norm layers, continual unless episodic."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import HParam, ImageEncoderUse, MethodCard

# The hparams the image-encoder methods share (one results column each).
STEPS = HParam("steps", "int", 1, "optimiser steps per batch (Tent's steps, SAR's and DeYO's --steps)", "count",
               low=1)
EPISODIC = HParam("episodic", "bool", False, "reset the encoder and optimiser before every batch (the official "
                  "episodic flag; false: continual along the stream)", "flag")
PRECISION = HParam("precision", "str", "fp32", "the encoder's forward in float32, or under CUDA fp16 autocast as "
                   "TTABC runs it (amp_fp16, GPU only)", "choice", choices=("fp32", "amp_fp16"))
# Activation memory of one image's adaptation step through the ViT-B/16 vision tower at 224 px, float32, its norm
# layers' affine parameters trainable: `orchestrator.methods.encoder.saved_bytes_per_image`, in MB (a test holds it).
NORM_STEP = 396.2

CARDS = (
    MethodCard(
        "tent", "Tent", 170, "encoder", "the image encoder's norm-layer affine parameters, one Adam step per batch "
        "on the batch's mean prediction entropy, carried along the stream (episodic: reset every batch); predicts "
        "with the forward it adapts on",
        "orchestrator.methods.tent.method:Tent",
        (HParam("lr", "float", 1e-3, "learning rate (cfgs/tent.yaml OPTIM.LR)", "rate", low=0.0, low_open=True,
                log=True),
         HParam("optimizer", "str", "adam", "Adam (betas 0.9, 0.999, no weight decay: cfgs/tent.yaml) or SGD "
                "(momentum 0.9: the ImageNet-C setting)", "choice", choices=("adam", "sgd")),
         STEPS, EPISODIC, PRECISION, LOGIT_SCALE),
        batch_size=200, image_encoder=ImageEncoderUse("norm", "episodic", NORM_STEP),
        source="DequanWang/tent@7d236b4 tent.py (Tent.forward, forward_and_adapt, collect_params, configure_model), "
               "cfgs/tent.yaml@1ffcd70 (Adam, LR 1e-3, BETA 0.9, WD 0, ITER 1, BATCH_SIZE 200); norm layers as "
               "walawalagoose/TTABC ttabc/model_selection/tent.py collects them on CLIP (LayerNorm, BatchNorm, "
               "GroupNorm)"),
)
