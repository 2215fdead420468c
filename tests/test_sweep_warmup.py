"""24.5: the first call of a method's code in a worker process (numba compiling the engine's walk, torch's lazy
set-up) is measured apart as the run's `warmup_s` and never counted in its samples/s or stage times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import copy, json, sys
    from orchestrator.sweep.load import validate_spec
    from orchestrator.sweep.plan import expand, make_trials
    from orchestrator.sweep.pieces import settings_of
    from orchestrator.sweep.trial import execute_trial

    spec = validate_spec({"name": "warm", "results_dir": "results",
                          "datasets": [{"synthetic": "temporal", "n": 600, "num_classes": 5, "dim": 16}],
                          "methods": [{"method": "bca", "tau": 0.3, "n1": 100}], "seeds": [1, 2],
                          "part_rows": 200}, base_dir=sys.argv[1])
    out = []
    for trial in make_trials(expand(spec), 1):  # two trials in one process, as a reused Ray actor runs them
        out += execute_trial(trial, settings_of(spec))
    print(json.dumps([{k: r[k] for k in ("warmup_s", "time_update_s", "samples_per_s")} for r in out]))
""")


def test_first_trial_pays_the_warm_up_apart(tmp_path):
    # an empty numba cache: the first call compiles, as on a fresh machine or after an upgrade
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["warmup_s"] > 0 and second["warmup_s"] == 0
    # compiling takes seconds, a warm update pass over 600 samples milliseconds: had the compilation reached the
    # run's own timers, its update stage would exceed the warm-up it is now kept out of
    assert first["time_update_s"] < first["warmup_s"]

    from orchestrator.results.db import ResultsDB
    with ResultsDB(tmp_path / "results") as db:
        recorded = db.df("SELECT seed, warmup_s FROM runs ORDER BY seed")
    assert recorded["warmup_s"].tolist() == [first["warmup_s"], 0.0]
