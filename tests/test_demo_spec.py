"""24.8: the demo runs each method at its paper's settings scaled to the stream: BCA's (and CLIP+LA's) n1 gives as
many updates per class relative to n1 as the paper's n1 = 30000 does on ImageNet (50,000 images over 1,000
classes); the fast setting stays only as one BCA row, labelled by its n1."""

from __future__ import annotations

from pathlib import Path

import yaml

from orchestrator.data.synthetic import synthetic_defaults
from orchestrator.registry import method_card

REPO = Path(__file__).resolve().parents[1]
PAPER_N1, IMAGENET_PER_CLASS = 30000, 50000 / 1000


def test_demo_scales_n1_to_its_streams():
    spec = yaml.safe_load((REPO / "experiments" / "demo.yaml").read_text())
    per_class = {d["synthetic"]: d["n"] / synthetic_defaults(d["synthetic"])["num_classes"] for d in spec["datasets"]}
    assert len(set(per_class.values())) == 1, per_class  # one n1 fits every dataset
    scaled = PAPER_N1 * next(iter(per_class.values())) / IMAGENET_PER_CLASS
    entries = [m for m in spec["methods"] if m["method"] in ("la", "bca")]
    at_paper_rate = [m for m in entries if m["n1"] == scaled]
    assert {m["method"] for m in at_paper_rate} == {"la", "bca"}
    fast = [m for m in entries if m["n1"] != scaled]
    assert fast == [{"method": "bca", "tau": 0.3, "n1": 100}]  # the one sensitivity row
    # everything else at the cards' defaults: the paper's tau and n2, TDA's caches, OnZeta's schedule
    for entry in spec["methods"]:
        for name, value in entry.items():
            if name not in ("method", "n1"):
                assert value == method_card(entry["method"]).hparam(name).default, (entry, name)
