"""What the results dir and the feature cache say about a run beyond its rows: the sweep record it came from,
a one-run spec that reproduces it, the feature-cache entries of its data (class names, counts, skips) and
where its images are.

Reads JSON files only (the sweep record, cache manifests): no torch, so the dashboard stays light.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import yaml

from orchestrator import registry
from orchestrator.results import schema

CACHE_MANIFEST_GLOB = "features/*/manifest.json"


def results_fingerprint(results_dir: str | Path) -> tuple[int, int, int]:
    """(files, newest mtime in ns, total bytes) of the live runs' Parquet files, the compacted store's manifest and
    the sweep records: it changes whenever a sweep writes (a run's saved state is written before its runs-table
    row says it finished), so the dashboard re-reads only then. Compacted runs' files are not listed: the
    manifest changes whenever they do."""
    count = newest = size = 0
    root = Path(results_dir)
    manifest = schema.manifest_file(root).relative_to(root).as_posix()
    for pattern in (schema.SAMPLES_GLOB, schema.RUNS_GLOB, schema.sweeps_root(root).relative_to(root).as_posix() + "/*.json", manifest):
        for path in root.glob(pattern):
            try:
                stat = path.stat()
            except OSError:  # removed while listing (a temporary file renamed into place)
                continue
            count, newest, size = count + 1, max(newest, stat.st_mtime_ns), size + stat.st_size
    return count, newest, size


def sweep_record(results_dir: str | Path, sweep: str) -> dict[str, Any] | None:
    """<results>/sweeps/<sweep>.json (name, run_ids, spec), or None when missing or unreadable."""
    try:
        return json.loads((schema.sweeps_root(results_dir) / f"{sweep}.json").read_text())
    except (OSError, ValueError):
        return None


def _drop_nulls(value: Any) -> Any:
    """The recorded spec dump lists every optional field as null; a spec written by hand leaves them out."""
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None and v != []}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _dataset_matches(entry: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    synthetic = config.get("synthetic")
    if entry.get("synthetic") is not None:
        if not isinstance(synthetic, dict) or synthetic.get("scenario") != entry["synthetic"]:
            return False
        given = {k: v for k, v in entry.items() if k not in ("synthetic", "views") and v is not None}
        return all(synthetic.get(k) == v for k, v in given.items())
    return synthetic is None and registry.dataset_key(entry.get("name", "")) == config.get("dataset")


def _backbone_matches(entry: Mapping[str, Any], config: Mapping[str, Any]) -> bool:
    weights = entry.get("checkpoint") or entry.get("pretrained")
    # a checkpoint that is the published file is recorded as its tag, with the file under `checkpoint`
    return entry.get("model") == config.get("backbone") and weights in (config.get("checkpoint"),
                                                                         config.get("pretrained"))


def reproduce_spec(record: Mapping[str, Any], config: Mapping[str, Any], run_id: str) -> dict[str, Any] | None:
    """A sweep spec that runs exactly this run: the recorded spec narrowed to the run's dataset, backbone,
    templates, method with its hparams, and seed, under the same sweep name (the name is part of the run id)
    and a results dir of its own. None when the record does not hold the run or its spec."""
    spec = record.get("spec")
    if not isinstance(spec, dict) or run_id not in record.get("run_ids", []):
        return None
    out = _drop_nulls(dict(spec))
    datasets = [d for d in spec.get("datasets", []) if _dataset_matches(d, config)]
    if len(datasets) != 1:
        return None
    out["datasets"] = [_drop_nulls(datasets[0])]
    if config.get("synthetic") is None:
        out["backbones"] = [_drop_nulls(b) for b in spec.get("backbones", []) if _backbone_matches(b, config)][:1]
        out["templates"] = [config["templates"]]
    # a learned context is the run's starting point: its file (the run config records it and its hash)
    context = {"context": config["context"]} if "context" in config else {}
    out["methods"] = [{"method": config["method"], **context, **config.get("hparams", {})}]
    out["seeds"] = [config["seed"]]
    # the run's own stream and order: a spec's list of streams and its `orders` multiply the runs
    out.pop("stream", None)
    if "stream" in config:
        out["stream"] = config["stream"]
    out["batch_size"] = schema.batch_size_of(config)
    if "order_index" in config:
        out["order"] = config["order_index"]
    else:
        out.pop("orders", None)
    out["results_dir"] = f"reproduce-{run_id}"
    out["pack"] = 1
    return out


def reproduce_text(spec: Mapping[str, Any], run_id: str) -> tuple[str, str]:
    """(YAML of the spec, the shell command running it)."""
    name = f"reproduce-{run_id}.yaml"
    return yaml.safe_dump(dict(spec), sort_keys=False), f"bca sweep {name}"


def cache_entries(cache_dir: str | Path | None, dataset: str, backbone: str) -> list[dict[str, Any]]:
    """The feature-cache entries of a dataset and backbone: key, views, seed, counts, skips, creation time and
    the class names (empty list when no cache dir or no entry)."""
    if not cache_dir or not Path(cache_dir).is_dir():
        return []
    out = []
    for path in sorted(Path(cache_dir).glob(CACHE_MANIFEST_GLOB)):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if manifest.get("dataset") != dataset or not str(manifest.get("backbone", "")).startswith(backbone):
            continue
        out.append({"key": manifest.get("key", path.parent.name), "backbone": manifest.get("backbone"),
                    "views": manifest.get("views"), "seed": manifest.get("seed"), "count": manifest.get("count"),
                    "skipped": manifest.get("skipped_count", 0), "created_at": manifest.get("created_at"),
                    "class_names": list(manifest.get("class_names") or [])})
    return out


def class_names(cache_dir: str | Path | None, dataset: str, backbone: str) -> list[str]:
    """The dataset's class names from its feature-cache manifest; [] when unknown (synthetic data has none)."""
    for entry in cache_entries(cache_dir, dataset, backbone):
        if entry["class_names"]:
            return entry["class_names"]
    return []


def class_namer(names: list[str]):
    """k -> 'k: name' when names are known, else 'class k' (all a synthetic run has); an OOD sample's label -1
    -> 'OOD' (it has no class)."""
    def name(k: int) -> str:
        k = int(k)
        if k == -1:
            return "OOD"
        return f"{k}: {names[k]}" if 0 <= k < len(names) else f"class {k}"
    return name


def image_path(data_root: str | None, image_id: str) -> Path | None:
    """A real dataset's image: data_root / image_id (the readers' ids are POSIX paths relative to the data
    root); None when there is no data root (synthetic rows) or the file is not on this machine."""
    if not data_root or not image_id:
        return None
    path = Path(data_root) / image_id
    return path if path.is_file() else None
