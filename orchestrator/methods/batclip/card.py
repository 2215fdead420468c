"""BATCLIP's card: both of CLIP's encoders' norm layers adapted on the batch's entropy, the projection of its
pseudo-class means onto their text features and the spread between those means."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tent.card import EPISODIC, NORM_STEP, PRECISION, STEPS
from orchestrator.registry.card import HParam, ImageEncoderUse, MethodCard

CARDS = (
    MethodCard(
        "batclip", "BATCLIP", 173, "encoder", "the norm-layer affine parameters of both the image and the text "
        "encoder, one AdamW step per batch on the mean prediction entropy minus the projection of each pseudo-class's "
        "mean image feature onto its text feature and minus the spread between the classes' means, carried along "
        "the stream; predicts with the forward it adapts on",
        "orchestrator.methods.batclip.method:BATCLIP",
        (HParam("lr", "float", 5e-4, "learning rate (cfgs/<benchmark>/ours.yaml OPTIM.LR)", "rate", low=0.0,
                low_open=True, log=True, per_dataset={"cifar10-c": 1e-3}),
         HParam("optimizer", "str", "adamw", "AdamW or Adam, betas (0.9, 0.999) (cfgs/<benchmark>/ours.yaml "
                "OPTIM.METHOD)", "choice", choices=("adamw", "adam"), per_dataset={"cifar100-c": "adam"}),
         HParam("weight_decay", "float", 0.01, "the optimiser's weight decay (OPTIM.WD; decoupled in AdamW, an L2 "
                "term in Adam)", "rate", low=0.0),
         STEPS, EPISODIC, PRECISION, LOGIT_SCALE),
        batch_size=64, templates="tpt1",
        image_encoder=ImageEncoderUse("norm", "episodic", NORM_STEP, text_tower=True, text_mb_per_class=18.1),
        source="sarthaxxxxx/BATCLIP@7a3b716 classification/methods/ours.py (OURS.forward_and_adapt, configure_model, "
               "collect_params), utils/losses.py (Entropy, I2TLoss, InterMeanLoss), models/model.py (ZeroShotCLIP: "
               "the text encoder run on the prompts every step), methods/base.py (setup_optimizer, episodic reset), "
               "cfgs/imagenet_c/ours.yaml (AdamW, LR 5e-4, WD 0.01, BATCH_SIZE 64, EPISODIC False, 'a photo of a "
               "{}.'); walawalagoose/TTABC ttabc/model_selection/batclip.py compared"),
)
