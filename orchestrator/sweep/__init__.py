"""Sweeps: a YAML spec validated at load (spec), expanded into runs and trials (plan), executed on Ray Tune
(runner) one online run per trial (trial), with progress lines and a final accuracy table (progress)."""

import os as _os

# A local Ray listens on loopback only (its default is the machine's network address). Ray reads this when
# it is first imported, so it is set here, before any sweep module imports Ray. Joining a cluster
# (RAY_ADDRESS, which `bca sweep --address` sets) keeps Ray's default.
if not _os.environ.get("RAY_ADDRESS"):
    _os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
