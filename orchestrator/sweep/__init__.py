"""Sweeps: a YAML spec validated at load (spec), expanded into runs and trials (plan), executed on Ray Tune
(runner) one online run per trial (trial), with progress lines and a final accuracy table (progress)."""
