"""Text embeddings (issue 24 item 11): encoding reports progress, and two processes asking for the same cache
key at once encode it once (the other waits on the cache's lock and reads the file)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from orchestrator.clip.backbone import BackboneSpec
from orchestrator.clip.prompts import class_embeddings
from orchestrator.clip.testing import TINY_VIT, register_tiny_models

REPO = Path(__file__).resolve().parents[1]
NAMES = [f"class number {k}" for k in range(1500)]
TEMPLATES = ["a photo of a {}.", "a drawing of a {}."]

WORKER = '''
import sys
import numpy as np
import torch
from orchestrator.clip.backbone import BackboneSpec
from orchestrator.clip.prompts import class_embeddings
from orchestrator.clip.testing import TINY_VIT, register_tiny_models

register_tiny_models()
cache, log, out = sys.argv[1:4]
names = [f"class number {k}" for k in range(1500)]
with open(log, "a") as f:
    emb, ids = class_embeddings(BackboneSpec(TINY_VIT, None), names, ["a photo of a {}.", "a drawing of a {}."],
                                cache_dir=cache, device="cpu",
                                progress=lambda done, total: (f.write(f"{done}/{total}\\n"), f.flush()))
np.save(out, emb.numpy())
'''


def test_encoding_reports_progress_per_batch():
    register_tiny_models()
    seen = []
    emb, _ = class_embeddings(BackboneSpec(TINY_VIT, None), NAMES[:600], TEMPLATES, device="cpu",
                              progress=lambda done, total: seen.append((done, total)))
    assert seen == [(256, 1200), (512, 1200), (768, 1200), (1024, 1200), (1200, 1200)]
    assert emb.shape == (600, 64)


def _key_lock(cache: Path) -> Path:
    """The lock file of the workers' cache key (as class_embeddings names it)."""
    from orchestrator.clip.backbone import precision_for, resolve_weights
    from orchestrator.clip.prompts import _text_key, resolve_templates

    register_tiny_models()
    identity = resolve_weights(BackboneSpec(TINY_VIT, None)).identity()
    return cache / "text" / f"{_text_key(identity, precision_for(torch.device('cpu')), NAMES, resolve_templates(TEMPLATES))}.lock"


def test_two_processes_encode_one_key_once(tmp_path):
    from filelock import FileLock

    lock = _key_lock(tmp_path / "cache")
    lock.parent.mkdir(parents=True)
    with FileLock(str(lock)):  # both workers start while the key is locked: both must wait for it
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "cache"), str(tmp_path / f"log{i}"),
                                   str(tmp_path / f"emb{i}.npy")], cwd=REPO) for i in range(2)]
        time.sleep(20)
        assert all(p.poll() is None for p in procs)
        assert all(not (tmp_path / f"log{i}").exists() or not (tmp_path / f"log{i}").read_text() for i in range(2))
    assert [p.wait(timeout=300) for p in procs] == [0, 0]
    logs = [(tmp_path / f"log{i}").read_text().split() for i in range(2)]
    assert sorted(len(log) for log in logs) == [0, 12]  # 3,000 prompts in batches of 256, all by one process
    assert np.array_equal(np.load(tmp_path / "emb0.npy"), np.load(tmp_path / "emb1.npy"))
    assert list((tmp_path / "cache" / "text").glob("*.npz")) == [lock.with_suffix(".npz")]  # the key we locked
