"""DOTA's card, with its configs/vit/*.yaml per dataset (epsilon, eta, rho; sigma is 0.002 everywhere)."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

_DOTA = {
    "imagenet": (1e-4, 0.2, 0.005), "imagenet-a": (1e-4, 0.5, 0.02), "imagenet-v2": (1e-4, 0.1, 0.01),
    "imagenet-r": (1e-4, 0.3, 0.0025), "imagenet-sketch": (1e-4, 0.8, 0.03), "caltech101": (0.002, 0.3, 0.02),
    "dtd": (1e-4, 0.3, 0.02), "eurosat": (1e-4, 3.0, 0.05), "aircraft": (1e-4, 0.2, 0.01),
    "food101": (4e-5, 0.1, 0.01), "flowers102": (1e-4, 0.2, 0.02), "pets": (1e-4, 0.3, 0.02),
    "cars": (1e-4, 0.3, 0.01), "sun397": (1e-4, 0.2, 0.01), "ucf101": (1e-4, 0.4, 0.02),
}
CARDS = (
    MethodCard(
        "dota", "DOTA", 70, "gaussian", "per-class Gaussian means and covariances from soft labels, shared precision",
        "orchestrator.methods.dota.method:DOTA",
        (HParam("epsilon", "float", 1e-4, "identity blended into the mean covariance before inverting", "weight",
                low=0.0, high=1.0, log=True, per_dataset={k: v[0] for k, v in _DOTA.items()}),
         HParam("eta", "float", 0.2, "cap of the Gaussian score's weight min(rho · mean count / views kept, eta)",
                "weight", low=0.0, per_dataset={k: v[1] for k, v in _DOTA.items()}),
         HParam("rho", "float", 0.005, "growth of the Gaussian score's weight with the samples seen", "rate", low=0.0,
                per_dataset={k: v[2] for k, v in _DOTA.items()}),
         HParam("sigma", "float", 0.002, "initial covariance sigma · I of every class", "scale", low=0.0,
                low_open=True, log=True),
         HParam("keep", "float", 0.1, "fraction of the views kept (lowest entropy; at least one)", "rate", low=0.0,
                high=1.0, low_open=True),
         LOGIT_SCALE),
        inputs="views", views=Views("augmix", scope="protocol"), state=("mu", "sigma", "counts", "precision"),
        # text, mu [K, d], scatter [K, d, d], the shared precision's factor and an identity [d, d], counts [K], two
        # float64 scalars
        cost=Cost(samples_per_s=5.0, gpu_samples_per_s=4664.0, state_words="K*d*d + 2*d*d + 2*K*d + K + 4"),
        lockstep=Lockstep("orchestrator.methods.dota.lockstep:run_dota_lockstep"),
        source="skylineeeeen/DOTA@bc67d44 (dota.py, configs/vit/); views: utils.py:156-168 build_test_data_loader, 64 "
               "AugMix views on ImageNet-A/-V2/-R/-Sketch, the original view elsewhere"),
)
