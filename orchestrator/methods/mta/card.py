"""MTA's card: the MeanShift mode of each sample's views, nothing kept between samples."""

from __future__ import annotations

from orchestrator.methods.hparams import LOGIT_SCALE
from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard, Views

CARDS = (
    MethodCard(
        'mta', 'MTA', 130, 'episodic', 'nothing kept: the MeanShift mode of each sample\'s views, weighted by inlierness',
        "orchestrator.methods.mta.method:MTA",
        (
            HParam('lambda_y', 'float', 0.2, 'temperature of the inlierness softmax (the entropic term)', 'scale', low=0.0,
                   low_open=True, log=True),
            HParam('lambda_q', 'float', 4.0, 'weight of the view-affinity (quadratic) term of the inlierness', 'weight',
                   low=0.0),
            LOGIT_SCALE,
        ),
        inputs='views', views=Views('crops'), state=(),
        cost=Cost(samples_per_s=5914.0, gpu_samples_per_s=70152.0, state_words='K*d'),
        source='MaxZanella/MTA@cafafdf mta.py (solve_mta), main.py; views: main.py:172-173 AugMixAugmenter(n_views=batch_size - 1, '
               'augmix=len(set_id) > 1 and args.tpt): crops on every dataset (AugMix only with --tpt)',
        # the official run embeds one prompt per class, "a photo of a {}." (main.py:113, 339; custom_clip.py:300-307)
        templates='tpt1',
        lockstep=Lockstep("orchestrator.methods.episodic:run_episodic_lockstep")),
)
