"""TPS's card: per-class shifts of the prototypes, reset every sample."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        'tps', 'TPS', 110, 'episodic', 'per-class shifts of the prototypes, one AdamW step per sample, reset every sample (episodic)',
        "orchestrator.methods.tps.method:TPS",
        (
            HParam('lr', 'float', 0.005, 'AdamW learning rate of the per-class shifts', 'rate', low=0.0, low_open=True, log=True, per_dataset={'aircraft': 0.001, 'caltech101': 0.001, 'cars': 0.001, 'dtd': 0.001, 'eurosat': 0.001, 'flowers102': 0.001, 'food101': 0.001, 'pets': 0.001, 'sun397': 0.001, 'ucf101': 0.001}),
            HParam('keep', 'float', 0.1, 'fraction of lowest-entropy views in the loss', 'threshold', low=0.0, high=1.0, low_open=True),
            LOGIT_SCALE,
        ),
        inputs='views', views=Views('augmix', groups={'ood': 'crops'}), state=(),
        cost=Cost(samples_per_s=589.0, gpu_samples_per_s=56566.0, state_words='2*K*d + 2*K'),
        source='elaine-sui/TPS@556db0fe310f029fc7b796ffa83eaa64c578b505 shift_classification.py, model/shifter.py; views: shift_classification.py:98-99 AugMixAugmenter(n_views=batch_size - 1, augmix=len(set_id) > 1): crops on ImageNet and its variants (one-letter set ids), AugMix on the cross-domain sets',
        lockstep=Lockstep("orchestrator.methods.episodic:run_episodic_lockstep")),
)
