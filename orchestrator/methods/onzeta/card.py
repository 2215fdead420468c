"""OnZeta's card (ImageNet only in its official code, so no per-dataset configs)."""

from __future__ import annotations

from orchestrator.registry.card import Cost, HParam, Lockstep, MethodCard

CARDS = (
    MethodCard(
        "onzeta", "OnZeta", 80, "onzeta", "class-proportion dual variable and vision-space class proxies",
        "orchestrator.methods.onzeta.method:OnZeta",
        (HParam("tau_t", "float", 0.01, "temperature of the text label q (0.01 is logit scale 100)", "scale", low=0.0,
                low_open=True, log=True),
         HParam("tau_i", "float", 0.04, "temperature of the vision-proxy label p", "scale", low=0.0, low_open=True,
                log=True),
         HParam("cw", "float", 0.5, "proxy learning rate constant: cw / sqrt(i + 1)", "rate", low=0.0),
         HParam("cr", "float", 20.0, "dual (class-proportion) learning rate constant: cr / sqrt(i + 1)", "rate",
                low=0.0),
         HParam("alpha", "float", 1.0, "target class proportion alpha / K (1: uniform)", "weight", low=0.0),
         HParam("beta", "float", 0.8, "final weight of the proxy label, reached at the last sample", "weight",
                low=0.0, high=1.0),
         HParam("n_total", "int", None, "stream length N of the mixing weight's schedule; null: the first run "
                "call's length", "size", low=1, nullable=True)),
        state=("W", "rho", "step"),
        cost=Cost(samples_per_s=2522.0, gpu_samples_per_s=110222.0, state_words="2*K*d + K"),
        stream_length="n_total",
        source="idstcv/OnZeta@befef06 (main_online.py); ImageNet only, no per-dataset configs",
        lockstep=Lockstep("orchestrator.methods.onzeta.lockstep:run_onzeta_lockstep")),
)
