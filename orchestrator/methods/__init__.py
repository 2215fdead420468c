"""Online test-time adaptation methods over CLIP embeddings: pure tensor state machines, no I/O.

    run_stream(method, features, class_embeddings, class_ids, num_classes, **hparams) -> posteriors [n, K]
    make_method(method, class_embeddings, class_ids, num_classes, **hparams).run(features) -> Trace

Methods: clip, la, pa, bca (the BCA family, `bca.py` / `reference.py`), tda, tda_pa (`tda.py`), zero (`zero.py`).
"""

from orchestrator.methods import bca as _bca  # noqa: F401  (registers clip, la, pa, bca)
from orchestrator.methods.base import (METHODS, Method, Trace, hparam_defaults, make_method,  # noqa: F401
                                       run_stream)

__all__ = ["METHODS", "Method", "Trace", "hparam_defaults", "make_method", "run_stream"]
