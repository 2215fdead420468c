"""DPE's card: textual prototypes and a visual cache, with its official per-dataset configs."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        'dpe', 'DPE', 100, 'prototype', 'textual prototypes and a visual cache, one AdamW step per sample on their residuals',
        "orchestrator.methods.dpe.method:DPE",
        (
            HParam('alpha', 'float', 6.0, 'weight of the visual-cache logits', 'weight', low=0.0, per_dataset={'imagenet': 6.0, 'imagenet-a': 6.0, 'imagenet-v2': 3.0, 'imagenet-r': 3.0, 'imagenet-sketch': 7.0, 'caltech101': 15.0, 'dtd': 6.0, 'eurosat': 3.0, 'aircraft': 6.0, 'food101': 3.0, 'flowers102': 2.5, 'pets': 4.0, 'cars': 3.0, 'sun397': 6.0, 'ucf101': 9.0}),
            HParam('beta', 'float', 5.0, 'sharpness of the cache affinity exp(-beta (1 - cos))', 'scale', low=0.0, per_dataset={'imagenet': 5.0, 'imagenet-a': 5.0, 'imagenet-v2': 8.0, 'imagenet-r': 8.0, 'imagenet-sketch': 7.45, 'caltech101': 5.0, 'dtd': 3.0, 'eurosat': 8.0, 'aircraft': 2.0, 'food101': 1.0, 'flowers102': 5.0, 'pets': 7.0, 'cars': 7.0, 'sun397': 3.0, 'ucf101': 8.0}),
            HParam('lr_text', 'float', 0.0006, 'AdamW learning rate of the textual residual', 'rate', low=0.0, low_open=True, log=True, per_dataset={'imagenet': 0.0006, 'imagenet-a': 0.0003, 'imagenet-v2': 0.0005, 'imagenet-r': 0.0006, 'imagenet-sketch': 0.0006, 'caltech101': 0.0006, 'dtd': 0.0006, 'eurosat': 5e-05, 'aircraft': 0.0006, 'food101': 0.0002, 'flowers102': 0.0001, 'pets': 5e-05, 'cars': 0.0001, 'sun397': 0.0002, 'ucf101': 0.0004}),
            HParam('lr_image', 'float', 0.0006, 'AdamW learning rate of the visual-cache residual', 'rate', low=0.0, low_open=True, log=True, per_dataset={'imagenet': 0.0006, 'imagenet-a': 0.0003, 'imagenet-v2': 0.0005, 'imagenet-r': 0.0006, 'imagenet-sketch': 0.0006, 'caltech101': 0.0006, 'dtd': 0.0006, 'eurosat': 5e-05, 'aircraft': 0.0006, 'food101': 0.0002, 'flowers102': 0.0001, 'pets': 5e-05, 'cars': 0.0001, 'sun397': 0.0002, 'ucf101': 0.0004}),
            HParam('align', 'float', 0.5, 'weight of the InfoNCE alignment of cache and text prototypes', 'weight', low=0.0, per_dataset={'imagenet': 0.5, 'imagenet-a': 2.5, 'imagenet-v2': 0.5, 'imagenet-r': 0.0, 'imagenet-sketch': 0.2, 'caltech101': 0.2, 'dtd': 0.2, 'eurosat': 0.2, 'aircraft': 0.2, 'food101': 0.2, 'flowers102': 0.2, 'pets': 0.2, 'cars': 1.5, 'sun397': 0.2, 'ucf101': 0.2}),
            HParam('shot', 'int', 3, 'cache entries per class', 'size', low=1),
            HParam('keep', 'float', 0.1, 'fraction of lowest-entropy views kept', 'threshold', low=0.0, high=1.0, low_open=True),
            HParam('tau_global', 'float', 0.1, 'normalised-entropy threshold of the global text-prototype update', 'threshold', low=0.0),
            LOGIT_SCALE,
            HParam('state_dtype', 'str', 'float32', 'dtype of the residuals and their AdamW step: float32 (default: float16\'s underflow belongs to the dtype, not the method) or float16 as the official code (main_dpe.py:163, 171, 177; its AdamW second moment underflows, a step reaches about 5 lr)', 'choice', choices=('float32', 'float16')),
            HParam('predict_views', 'str', 'original', 'predict on the original view or on the re-selected confident views', 'choice', choices=('original', 'confident'), per_dataset={'imagenet-a': 'confident'}),
        ),
        inputs='views', views=Views('augmix', scope='protocol', groups={'ood': 'augmix'}),
        state=('text', 'text_updates', 'cache_keys', 'cache_entropy'),
        # prototypes and the cache mean [K, d], cache keys [K, shot, d] with their flat copy, its int64 classes and
        # entropies, bool flags [K]
        cost=Cost(samples_per_s=106.0, gpu_samples_per_s=5551.0, state_words='2*K*shot*d + 2*K*d + 3*K*shot + K/4'),
        source='zhangce01/DPE-CLIP@fecae5a50d7dc39fb944221be390201a56948416 main_dpe.py, utils.py, configs/; views: utils.py:201-210 build_test_data_loader gives ImageNet and its variants get_preprocess() (utils.py:177, 63 AugMix views + the original), the cross-domain sets the plain preprocess (utils.py:212-215)',
        lockstep=Lockstep("orchestrator.methods.dpe.lockstep:run_dpe_lockstep")),
)
