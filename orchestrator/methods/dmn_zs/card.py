"""DMN-ZS's card: a per-class memory of confident test features read by attention."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        'dmn_zs', 'DMN-ZS', 120, 'memory', 'a per-class memory of confident test features read by attention',
        "orchestrator.methods.dmn_zs.method:DMNZeroShot",
        (
            HParam('memory_size', 'int', 50, 'memory entries per class', 'size', low=1),
            HParam('beta', 'float', 5.5, 'sharpness of the attention weights exp(-beta (1 - cos))', 'scale', low=0.0),
            HParam('memory_weight', 'float', 1.0, 'weight of the memory posterior against the text posterior (per dataset: the official logs\' values, chosen on test labels)', 'weight', low=0.0, per_dataset={'imagenet': 1.0, 'flowers102': 10.0, 'dtd': 10.0, 'pets': 1.0, 'cars': 0.3, 'ucf101': 0.3, 'caltech101': 0.3, 'food101': 0.3, 'sun397': 3.0, 'aircraft': 1.0, 'eurosat': 0.3, 'imagenet-a': 3.0, 'imagenet-v2': 1.0, 'imagenet-r': 0.3, 'imagenet-sketch': 1.0}),
            HParam('keep', 'float', 0.1, 'fraction of lowest-entropy views that choose the pseudo-label', 'threshold', low=0.0, high=1.0, low_open=True),
            LOGIT_SCALE,
        ),
        inputs='views', views=Views('augmix', count=32, groups={'ood': 'crops'}),
        state=('memory', 'memory_entropy', 'memory_count'),
        # memory, its entropies, prototypes, int64 counts
        cost=Cost(samples_per_s=325.0, gpu_samples_per_s=8658.0,
                  state_words='K*memory_size*d + K*memory_size + K*d + 2*K'),
        source='YBZh/DMN@c6c218c70ebbc701b31cc3d7f7b9597117daad8e dmn_main.py (DualMem, direct_inference); views: dmn_main.py:419-420 AugMixAugmenter(n_views=batch_size - 1, augmix=len(set_id) > 1) with bs=32 (scripts/run.sh:12): 31 crops on ImageNet and its variants, 31 AugMix views on the cross-domain sets',
        lockstep=Lockstep("orchestrator.methods.dmn_zs.lockstep:run_dmn_lockstep")),
)
