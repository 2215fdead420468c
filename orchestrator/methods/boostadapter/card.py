"""BoostAdapter's card, with its configs/*.yaml per dataset."""

from __future__ import annotations

from orchestrator.methods.tda.card import FAMILY, TDA_STATE, TDA_WORDS
from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

# BoostAdapter's configs/*.yaml: positive cache (alpha, beta) and delta (imagenet.yaml has no delta: unused
# there, ImageNet runs with one view); the cache query is view 0 on the cross-domain sets (`infer_ori_image`)
# and the confident views' mean on ImageNet's variants.
_BOOST = {
    "imagenet": (2.0, 5.0, 0), "imagenet-a": (2.0, 5.0, 3), "imagenet-v2": (1.0, 8.0, 1),
    "imagenet-r": (1.0, 8.0, 3), "imagenet-sketch": (2.363, 7.45, 1), "caltech101": (5.0, 5.0, 2),
    "dtd": (2.0, 3.0, 0), "eurosat": (4.0, 8.0, 0), "aircraft": (2.0, 2.0, 2), "food101": (1.0, 1.0, 3),
    "flowers102": (1.0, 5.0, 0), "pets": (2.0, 7.0, 0), "cars": (1.0, 7.0, 3), "sun397": (2.0, 3.0, 1),
    "ucf101": (3.0, 8.0, 0),
}
CARDS = (
    MethodCard(
        'boostadapter', 'BoostAdapter', 140, FAMILY,
        'TDA\'s positive / negative caches, the positive one boosted per sample by its own confident views',
        "orchestrator.methods.boostadapter.method:BoostAdapter",
        (
            HParam('pos_alpha', 'float', 2.0, 'weight of the positive (boosting) cache\'s logits', 'weight', low=0.0,
                   per_dataset={k: a for k, (a, _, _) in _BOOST.items()}),
            HParam('pos_beta', 'float', 5.0, 'sharpness of the positive cache\'s affinities', 'scale', low=0.0,
                   per_dataset={k: b for k, (_, b, _) in _BOOST.items()}),
            HParam('neg_alpha', 'float', 0.117, 'weight of the negative cache\'s logits', 'weight', low=0.0),
            HParam('neg_beta', 'float', 1.0, 'sharpness of the negative cache\'s affinities', 'scale', low=0.0),
            HParam('pos_shot', 'int', 3, 'positive cache entries per class', 'size', low=1),
            HParam('neg_shot', 'int', 2, 'negative cache entries per class (first in, first out)', 'size', low=1),
            HParam('delta', 'int', 0, 'boosting-cache entries per class beyond pos_shot', 'size', low=0,
                   per_dataset={k: d for k, (_, _, d) in _BOOST.items()}),
            HParam('keep', 'float', 0.1, 'fraction of lowest-entropy views: the confident query and the boosting views',
                   'threshold', low=0.0, high=1.0, low_open=True),
            HParam('query', 'str', 'original', 'the caches\' query: the original view or the confident views\' mean',
                   'choice', choices=('original', 'confident'),
                   per_dataset=dict.fromkeys(("imagenet-a", "imagenet-v2", "imagenet-r", "imagenet-sketch"), 'confident')),
            LOGIT_SCALE,
        ),
        inputs='views', views=Views('crops', single_datasets=('imagenet',)), state=TDA_STATE,
        cost=Cost(samples_per_s=780.0, gpu_samples_per_s=9594.0, state_words=TDA_WORDS + ' + K*d'),
        source='taolinzhang/BoostAdapter@9983e1a runner.py (run_test_tda, boostadapter mode), utils.py, configs/; views: '
               'utils.py:155-168 build_test_data_loader, AugMixAugmenter(augmix=False) (utils.py:122, 131) on all but ImageNet',
        lockstep=Lockstep("orchestrator.methods.boostadapter.lockstep:run_boostadapter_lockstep")),
)
