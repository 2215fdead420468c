"""A validated spec expanded into runs (one config, one seed each) and grouped into trials.

Expansion order is fixed (datasets x seeds x backbones x template sets x method entries x grid points, then
runs sharing a data source brought together), so the same spec always gives the same runs with the same
run_ids (results.schema.config_hash of the run config).
A trial is one run, or with `pack: G` up to G runs that share a data source (same features, class embeddings
and stream order) and run through the multi-config engine in one pass.

Synthetic datasets do not depend on a backbone or template set: each runs once per (method config, seed),
with backbone 'synthetic'. Its seed generates the benchmark; the stream is the scenario's own order.
Real datasets stream in a seeded permutation of the dataset (the trial stores it with the run).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.data.streams import (HELD_OUT_CLASSES, Contaminated, Continual, Iid, Protocol, derive_order_seeds,
                                       protocol_from_spec)
from orchestrator.registry import method_card
from orchestrator.results.schema import canonical_json, config_hash, normalize_config
from orchestrator.sweep.spec import (Backbone, RealDataset, SweepSpec, SyntheticDataset, dataset_name, dataset_views,
                                     entry_datasets, method_grid)

SYNTHETIC_BACKBONE = "synthetic"


@dataclass(frozen=True)
class DataSource:
    """Everything that determines a run's input stream: features, class embeddings and stream order.

    Hashable: trials with equal sources share the features a trial process has loaded (the per-process memo).
    """

    dataset: str
    seed: int
    views: str = "single"
    synthetic: str | None = None          # scenario; None for a real dataset
    synthetic_params: str = "{}"          # canonical JSON of the scenario's parameters
    model: str | None = None
    pretrained: str | None = None
    checkpoint: str | None = None
    model_config: str | None = None
    quick_gelu: bool | None = None
    templates: str | None = None
    stream: str = ""                      # canonical JSON of the spec's `stream:`; "" = the dataset's own order
    order_index: int = 0                  # which of `orders: N` (0: the seed's own order)
    others: tuple[str, ...] = ()          # a contaminated stream's pool dataset, a continual stream's next datasets

    @property
    def is_synthetic(self) -> bool:
        return self.synthetic is not None

    @property
    def weights(self) -> str | None:
        """What the backbone loads: the checkpoint file if one is given, else the pretrained tag (None: random)."""
        return self.checkpoint if self.checkpoint is not None else self.pretrained

    def params(self) -> dict[str, Any]:
        return json.loads(self.synthetic_params)

    def protocol(self) -> Protocol | None:
        """The stream protocol: the spec's, else a real dataset's seeded shuffle (iid) and a synthetic
        scenario's own order (None)."""
        if self.stream:
            return protocol_from_spec(json.loads(self.stream))
        return None if self.is_synthetic else Iid()

    @property
    def order_seed(self) -> int:
        """The seed of this order: the run's seed for the first of `orders`, then distinct derived ones."""
        return derive_order_seeds(self.seed, self.order_index + 1)[self.order_index]


@dataclass(frozen=True)
class Run:
    run_id: str
    config: dict[str, Any]    # the normalised run config (results.schema), stored with every file of the run
    source: DataSource

    @property
    def label(self) -> str:
        """A short human description: method, dataset, seed."""
        return f"{self.config['method']} {self.config['dataset']} seed={self.config['seed']}"


@dataclass(frozen=True)
class Trial:
    key: str                   # run_id of a single run; for a pack, a hash of its run_ids
    source: DataSource
    runs: tuple[Run, ...]


def _grid_points(entry: Any) -> list[dict[str, Any]]:
    grid = method_grid(entry)
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def _hparams(method: str, dataset: str, synthetic: bool, point: dict[str, Any]) -> dict[str, Any]:
    """Every hparam of the method: its card's defaults (per dataset for a benchmark dataset), then the point."""
    return method_card(method).resolve(point, None if synthetic else dataset)


def _sources(spec: SweepSpec, dataset: RealDataset | SyntheticDataset, seed: int, views: str
             ) -> list[tuple[DataSource, dict]]:
    """The data sources of one dataset, seed and view setting, each with the run-config fields it implies: one per
    backbone and template set, times the stream protocols and their `orders`."""
    out = []
    for value in spec.streams:
        protocol = protocol_from_spec(value) if value is not None else None
        if isinstance(protocol, Continual) and dataset_name(dataset) != protocol.datasets[0]:
            continue  # a continual stream runs once, from its first dataset through the others
        for source, fields in _base_sources(spec, dataset, seed, views):
            stream: dict[str, Any] = {}
            if protocol is not None:
                stream["stream"] = value  # in the config only when given, so earlier runs keep their run_ids
                source = replace(source, stream=canonical_json(value), others=_others(protocol))
                if isinstance(protocol, Continual):
                    stream["dataset"] = "+".join(protocol.datasets)
            for k in range(spec.orders):
                order = {"order_index": k} if spec.orders > 1 else {}
                out.append((replace(source, order_index=k), {**fields, **stream, **order}))
    return out


def _others(protocol: Protocol) -> tuple[str, ...]:
    """The datasets a stream reads besides the run's own: a contaminated stream's pool, a continual one's next."""
    if isinstance(protocol, Contaminated) and protocol.pool != HELD_OUT_CLASSES:
        return (protocol.pool,)
    if isinstance(protocol, Continual):
        return protocol.datasets[1:]
    return ()


def _base_sources(spec: SweepSpec, dataset: RealDataset | SyntheticDataset, seed: int, views: str
                  ) -> list[tuple[DataSource, dict]]:
    if isinstance(dataset, SyntheticDataset):
        params = dataset.params
        source = DataSource(dataset=dataset.dataset_name, seed=seed, synthetic=dataset.synthetic,
                            synthetic_params=canonical_json(params))
        fields = {"backbone": SYNTHETIC_BACKBONE, "pretrained": None, "templates": None,
                  "num_templates": params.get("templates_per_class", 1), "views": "single",
                  "synthetic": {"scenario": dataset.synthetic, **params}, "stream_order": "scenario"}
        return [(source, fields)]
    from orchestrator.sweep.catalog import effective_templates, template_counts

    out = []
    for backbone, asked in itertools.product(spec.backbones, spec.templates):
        templates = effective_templates(asked, dataset.name, spec.data_root)[0]
        source = DataSource(dataset=dataset.name, seed=seed, views=views, model=backbone.model,
                            pretrained=backbone.pretrained, checkpoint=backbone.checkpoint,
                            model_config=backbone.config, quick_gelu=backbone.quick_gelu, templates=templates)
        fields = {"backbone": backbone.model, "pretrained": source.weights, "templates": templates,
                  "num_templates": template_counts(templates, dataset.name)[0], "views": views,
                  "stream_order": "permutation", **_backbone_extras(backbone)}
        out.append((source, fields))
    return out


def _backbone_extras(backbone: Backbone) -> dict[str, Any]:
    """Run-config keys a backbone sets only when used: the activation override, a custom config's content."""
    extras: dict[str, Any] = {}
    if backbone.quick_gelu is not None:
        extras["quick_gelu"] = backbone.quick_gelu
    if backbone.config is not None:
        extras["model_config_sha256"] = hashlib.sha256(Path(backbone.config).read_bytes()).hexdigest()[:16]
    return extras


def _entries_by_views(spec: SweepSpec, dataset: RealDataset | SyntheticDataset) -> dict[str, list[Any]]:
    """The method entries that run on a dataset, grouped by the views each runs on (in entry order)."""
    groups: dict[str, list[Any]] = {}
    for entry in spec.methods:
        if dataset in entry_datasets(spec, entry):
            groups.setdefault(dataset_views(spec, dataset, entry.method), []).append(entry)
    return groups


def template_notes(spec: SweepSpec) -> list[str]:
    """What the plan says of template sets it could not use as asked (a missing CuPL prompt file)."""
    if not spec.has_real_datasets:
        return []
    from orchestrator.sweep.catalog import effective_templates

    notes = [effective_templates(t, d.name, spec.data_root)[1] for d in spec.datasets if isinstance(d, RealDataset)
             for t in spec.templates]
    return [n for n in notes if n]


def data_sources(spec: SweepSpec) -> list[DataSource]:
    """Every distinct data source of the spec (what `bca cache` encodes and trials load), in expansion order."""
    return list(dict.fromkeys(source for dataset in spec.datasets for views in _entries_by_views(spec, dataset)
                              for seed in spec.seeds for source, _ in _sources(spec, dataset, seed, views)))


def expand(spec: SweepSpec) -> list[Run]:
    """Every run of the spec, in the fixed expansion order. A config that two method entries both give (e.g.
    the shared centre of one-at-a-time sensitivity grids) is one run."""
    runs: list[Run] = []
    seen: set[str] = set()
    for dataset in spec.datasets:
        groups = _entries_by_views(spec, dataset)
        for seed in spec.seeds:
            for views, entries in groups.items():
                for source, fields in _sources(spec, dataset, seed, views):
                    for entry in entries:
                        for point in _grid_points(entry):
                            config = normalize_config({
                                "sweep": spec.name, "dataset": source.dataset, "method": entry.method,
                                "seed": seed, **fields,
                                "hparams": _hparams(entry.method, source.dataset, source.is_synthetic, point),
                            })
                            run_id = config_hash(config)
                            if run_id not in seen:
                                seen.add(run_id)
                                runs.append(Run(run_id, config, source))
    return _order_by_source(runs)


def _order_by_source(runs: list[Run]) -> list[Run]:
    """Runs sharing a data source next to each other (stable), so a trial process reuses loaded features."""
    first: dict[DataSource, int] = {}
    for i, run in enumerate(runs):
        first.setdefault(run.source, i)
    return sorted(runs, key=lambda r: first[r.source])


def make_trials(runs: list[Run], pack: int) -> list[Trial]:
    """Group runs into trials: singletons, or packs of up to `pack` runs sharing a data source and the kind
    of features they take (runs taking views are packed only with runs taking views)."""
    groups: dict[tuple[DataSource, bool], list[Run]] = {}
    for run in runs:
        views = run.source.views != "single" and method_card(run.config["method"]).wants_views(run.config["hparams"])
        groups.setdefault((run.source, views), []).append(run)
    trials: list[Trial] = []
    for (source, _views), group in groups.items():
        for start in range(0, len(group), pack):
            members = tuple(group[start:start + pack])
            trials.append(Trial(_trial_key(members), source, members))
    return trials


def _trial_key(members: tuple[Run, ...]) -> str:
    if len(members) == 1:
        return members[0].run_id
    return "pack-" + hashlib.sha256(",".join(r.run_id for r in members).encode()).hexdigest()[:16]
