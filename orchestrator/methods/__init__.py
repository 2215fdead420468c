"""Online test-time adaptation methods over CLIP embeddings: pure tensor state machines, no I/O.

    run_stream(method, features, class_embeddings, class_ids, num_classes, **hparams) -> posteriors [n, K]
    make_method(method, class_embeddings, class_ids, num_classes, **hparams).run(features) -> Trace
    run_stream_many(features, class_embeddings, class_ids, num_classes, configs) -> (predictions [G, n],
    confidences [G, n]); run_traces_many(...) -> one Trace per config (`many.py`: the BCA family on the
    blocked engine, every other method as lockstep streams, `lockstep`)

What each method is (label, hparams with types, ranges, defaults and per-dataset defaults, inputs, state) is
its registry card: `orchestrator.registry.method_card(name)`. Implementations: the BCA family clip, la, pa,
bca (`bca.py`, equations in `reference.py`), tda, tda_pa (`tda.py`), onzeta (`onzeta.py`), and on features
[n, V, d] dota, dpe, boostadapter, dmn_zs and the episodic zero, mta and tps (`episodic.py`);
la, pa, bca, tda and tda_pa also take augmented views [n, V, d] (their card's inputs 'either').
Inputs are float32, expected L2-normalised, on any one torch device.
"""

from orchestrator.methods.base import Method, Trace, make_method, run_stream
from orchestrator.methods.many import run_stream_many, run_traces_many

__all__ = ["Method", "Trace", "make_method", "run_stream", "run_stream_many", "run_traces_many"]
