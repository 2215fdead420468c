"""Online test-time adaptation methods over CLIP embeddings: pure tensor state machines, no I/O.

    run_stream(method, features, class_embeddings, class_ids, num_classes, **hparams) -> posteriors [n, K]
    make_method(method, class_embeddings, class_ids, num_classes, **hparams).run(features) -> Trace
    run_stream_many(features, class_embeddings, class_ids, num_classes, configs) -> (predictions [G, n],
    confidences [G, n]); run_traces_many(...) -> one Trace per config (`many.py`)
    hparam_defaults(method) -> every valid hparam with its default; tda_defaults(dataset) -> TDA's per-dataset
    positive-cache alpha / beta.

Methods: clip, la, pa, bca (the BCA family: `bca.py`, equations in `reference.py`), tda, tda_pa (`tda.py`),
zero (`zero.py`, features [n, V, d]), dota (`dota.py`, features [n, V, d]), onzeta (`onzeta.py`).
Inputs are float32, expected L2-normalised, on any one torch device.
"""

# Importing the method modules registers them in METHODS.
from orchestrator.methods import bca as _bca  # noqa: F401
from orchestrator.methods import dota as _dota  # noqa: F401
from orchestrator.methods import onzeta as _onzeta  # noqa: F401
from orchestrator.methods import zero as _zero  # noqa: F401
from orchestrator.methods.base import METHODS, Method, Trace, hparam_defaults, make_method, run_stream
from orchestrator.methods.many import run_stream_many, run_traces_many
from orchestrator.methods.tda import tda_defaults

__all__ = ["METHODS", "Method", "Trace", "hparam_defaults", "make_method", "run_stream", "run_stream_many",
           "run_traces_many", "tda_defaults"]
