"""WATT's card: the image encoder's LayerNorms adapted once per text template, the templates' weights averaged, reset
before every batch."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.methods.tent.card import NORM_STEP, PRECISION
from orchestrator.registry.card import HParam, ImageEncoderUse, MethodCard

CARDS = (
    MethodCard(
        "watt", "WATT", 173, "encoder", "the image encoder's LayerNorm affine parameters, adapted on each of 8 "
        "text templates (2 Adam steps on a cross-entropy towards the batch's image-image and text-text "
        "similarities; in turn, WATT-S, or each from the last average, WATT-P) and the templates' weights averaged, "
        "5 times per batch, reset before every batch; predicts with the averaged weights and the templates' mean "
        "text embedding",
        "orchestrator.methods.watt.method:WATT",
        (HParam("lr", "float", 1e-3, "Adam learning rate (bash/watt_s CIFAR-10-C / -100-C scripts and the README; "
                "1e-4 in the domain-shift scripts and main.py's default)", "rate", low=0.0, low_open=True, log=True),
         HParam("variant", "str", "sequential", "WATT-S: each round's templates adapt one after another, the first "
                "from the last average (--watt_type sequential, the README's and the corruption scripts'); WATT-P: "
                "each template from the last average (parallel)", "choice", choices=("sequential", "parallel")),
         HParam("template_steps", "int", 2, "Adam steps per template before averaging (--watt_l)", "count", low=1),
         HParam("rounds", "int", 5, "rounds of adaptation and averaging per batch (--watt_m)", "count", low=1),
         PRECISION, LOGIT_SCALE),
        batch_size=128, templates="watt8", image_encoder=ImageEncoderUse("norm", True, NORM_STEP),
        source="Mehrdad-Noori/WATT@89d5089 adapt/watt.py (WATT.perform_adaptation, evaluate, set_ln_grads, "
               "collect_ln_params, weight_average, cross_entropy), clip/model.py@af1299c (CLIP.forward with "
               "text_ensemble), main.py@40e3fae (reset before every batch, batch size 128), templates.yaml@b11de14 "
               "(8 templates), bash/watt_s/CIFAR/cifar10c.sh (sequential, l 2, m 5, lr 1e-3), bash/watt_p (parallel)"),
)
