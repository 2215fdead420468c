"""StatA (Zanella, Fuchs et al., CVPR 2025), online mode: each batch of the stream solved on its own with the
statistical anchor, as `MaxZanella/StatA` main.py (--online) and solvers/StatA.py run it.

StatA is TransCLIP's batch solver (`orchestrator.methods.transclip.method`, whose docstring has the equations and
every difference from the code) with the anchor on the text statistics:

    sigma0_d = sum_ik y_hat_ik (x_id - w_kd)^2 / b                the zero-shot spread, every class starts there
    z update: the Gaussian term gains -1/2 sum_d log sigma_kd
    beta_k = n_k / (alpha + n_k + 1e-12)                          n_k: samples predicted k (soft_beta: sum_i z_ik)
    mu_k <- normalise(beta_k normalise(sum_i z_ik x_i / sum_i z_ik) + (1 - beta_k) w_k)
    sigma_kd <- beta_k sum_i z_ik (x_id - mu_kd)^2 / sum_i z_ik + (1 - beta_k) (sigma0_d + (w_kd - mu_kd)^2)

so a class the batch barely holds stays at its text statistics: what keeps StatA from collapsing on batches
with few classes, where TransCLIP does.

The online protocol: the official loop takes batches of b from the Dirichlet stream (slots = min(n // b,
classes): `orchestrator.data`'s sampler) and drops the last partial batch; here every sample is predicted, the
last batch solved as it is (fewer than b samples, with min(n_neighbors, b - 1) neighbours each). b is ambiguous
upstream: the README's table and script/StatA_online.sh use 128, main.py's --batch_size default and one README
command 64; the card's batch size is 128, the size behind the published online table. The code's defaults
(alpha 1, hard beta, 3 neighbours, 10 iterations) serve every dataset in its scripts (script/StatA_online.sh),
so there are no per-dataset values. Code vs paper: this module follows the code; the departures listed in
`transclip/method.py` are from the code. The paper (arXiv 2501.03729) states the anchor as a KL term on the
Gaussian statistics solved by block-coordinate descent; its equations were not compared line by line with the
code here, so none is offered as an alternative.
"""

from __future__ import annotations

from orchestrator.methods.transclip.method import TransductiveBatch


class StatA(TransductiveBatch):
    name = "stata"
    anchor = True
