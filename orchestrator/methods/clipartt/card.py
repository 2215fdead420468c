"""CLIPArTT's card: the image encoder's norm layers adapted, per batch, towards a transductive target built from
pseudo-captions of each image's top classes."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tent.card import NORM_STEP, PRECISION
from orchestrator.registry.card import HParam, ImageEncoderUse, MethodCard

CARDS = (
    MethodCard(
        "clipartt", "CLIPArTT", 175, "encoder", "the image encoder's norm-layer affine parameters, 10 Adam steps per "
        "batch on the cross-entropy between the image-to-caption logits and a target from the batch's image-image "
        "and caption-caption similarities, each image's pseudo-caption naming its top 3 classes ('a photo of a c1 "
        "or c2 or c3'); reset every batch; predicts after adapting",
        "orchestrator.methods.clipartt.method:CLIPArTT",
        (HParam("lr", "float", 1e-3, "Adam learning rate (adapt.py setup_optimizer)", "rate", low=0.0, low_open=True,
                log=True),
         HParam("steps", "int", 10, "Adam steps per batch (--niter)", "count", low=1),
         HParam("top_k", "int", 3, "classes each pseudo-caption names (--K)", "count", low=1),
         HParam("temperature", "float", 0.01, "temperature of the target's softmax over the averaged image and "
                "caption similarities (models/tent.py forward_and_adapt)", "scale", low=0.0, low_open=True, log=True),
         HParam("episodic", "bool", True, "reset the encoder and optimiser before every batch (the official runs: "
                "episodic=True; false: continual along the stream)", "flag"),
         PRECISION, LOGIT_SCALE),
        batch_size=128, templates="handcrafted1",
        image_encoder=ImageEncoderUse("norm", "episodic", NORM_STEP, text_tower=True),
        source="dosowiechi/CLIPArTT@6f439ba models/tent.py (Tent.forward, forward_and_adapt with target_method 1, "
               "getprompt, collect_params, configure_model), adapt.py (setup_tent: Adam lr 1e-3, episodic, the "
               "class prompts 'a photo of a {}', the prediction after adapting), configuration.py (--K 3, --niter "
               "10, --batch-size 128)"),
)
