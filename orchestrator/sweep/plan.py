"""A validated spec expanded into runs (one config, one seed each) and grouped into trials.

Expansion order is fixed (datasets x seeds x view settings x backbones x template sets x streams x orders x
method entries x batch sizes x grid points, then runs sharing a data source brought together), so the same spec
always gives the same runs with the same run_ids (results.schema.config_hash of the run config).
A trial is one run, or with `pack: G` up to G runs (`pack: auto`, the default: as many as orchestrator.sweep.cost
sizes) that share a data source (same features, class embeddings
and stream order) and run through the multi-config engine in one pass.

Zero-shot CLIP, the baseline gains are measured against, runs on every stream order a batch run of its data
source reads as well as on its own: a Dirichlet order's slots depend on the batch size (`stream_for_batch`), so a
batch run's baseline is CLIP on that very order (one more CLIP run per such order, at batch size 1).

Synthetic datasets do not depend on a backbone or template set: each runs once per (method config, seed),
with backbone 'synthetic'. Its seed generates the benchmark; the stream is the scenario's own order.
Real datasets stream in a seeded permutation of the dataset (the trial stores it with the run).

Hyperparameters a run cannot feel (their card's `when` is not met, e.g. `decay` with `update: count`) take
their default in its config, so a grid over them gives one run, not several identical ones, and a run that
already used the default keeps its run_id.

A method entry's grid points come resolved from its card (`MethodCard.grid_axes`: checked values, defaults,
the `when` and `null_means` rules); the plan only hashes each run's config (`results.schema.grid_run_ids`).
Big grids: a run holds its run_id, its data source, a group shared by the runs of one (source, method entry)
and a tuple of hparam values; its config dict is built only when asked for.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import itertools
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple

from orchestrator.data.streams import (HELD_OUT_CLASSES, Contaminated, Continual, Iid, Protocol, Realtime,
                                       derive_order_seeds, protocol_from_spec, stream_for_batch, stream_value)
from orchestrator.registry import MethodCard, baseline_method, method_card
from orchestrator.registry.backbones import names_teacher
from orchestrator.registry.corruptions import continual_name
from orchestrator.registry.views import parse_views
from orchestrator.results.schema import RunConfig, batch_size_of, canonical_json, grid_run_ids, normalize_config
from orchestrator.sweep import cost as costs
from orchestrator.sweep.spec import (RANDOM_WEIGHTS, STATISTICS_FIELDS, Backbone, RealDataset, SweepSpec,
                                     SyntheticDataset, dataset_name, dataset_views, entry_datasets, method_grid,
                                     method_templates)

SYNTHETIC_BACKBONE = "synthetic"


@dataclass(frozen=True)
class DataSource:
    """Everything that determines a run's input stream: features, class embeddings and stream order.

    Hashable: trials with equal sources share the features a trial process has loaded (the per-process memo).
    `pretrained` is None for random weights (the run config says 'random').
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
    auxiliary: str = ""                   # canonical JSON of the auxiliary encoders its runs read ("": none)
    context: str | None = None            # a learned context file a frozen-feature method reads (`clip.context`)
    context_sha256: str | None = None     # its sha256 when planned (a trial refuses a file changed since)
    context_source: str | None = None     # whose: CoOp's prompts the text tower only, MaPLe's both towers

    @property
    def is_synthetic(self) -> bool:
        return self.synthetic is not None

    @property
    def image_context_sha256(self) -> str | None:
        """The context the images are encoded through (the feature-cache entry's key): MaPLe's, none for CoOp's."""
        from orchestrator.clip.context import MAPLE

        return self.context_sha256 if self.context_source == MAPLE else None

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
            return protocol_from_spec(stream_value(self.stream))
        return None if self.is_synthetic else Iid()

    @property
    def order_seed(self) -> int:
        """The seed of this order: the run's seed for the first of `orders`, then distinct derived ones."""
        return derive_order_seeds(self.seed, self.order_index + 1)[self.order_index]


class _Group:
    """What the runs of one (data source, method entry) share: the config without hparams, the hparam names
    (sorted, as stored) and the entry's shards per run."""

    __slots__ = ("base", "names", "shards")

    def __init__(self, base: dict[str, Any], names: tuple[str, ...], shards: int = 1) -> None:
        self.base = base
        self.names = names
        self.shards = shards


class Run:
    """One online run: run_id, data source, and (built on demand) its normalised run config (results.schema),
    stored with every file of the run."""

    __slots__ = ("run_id", "source", "_group", "_values")

    def __init__(self, run_id: str, source: DataSource, group: _Group, values: tuple[Any, ...]) -> None:
        self.run_id, self.source, self._group, self._values = run_id, source, group, values

    @property
    def method(self) -> str:
        return self._group.base["method"]

    @property
    def backbone(self) -> str:
        return self._group.base["backbone"]

    @property
    def batch_size(self) -> int:
        return batch_size_of(self._group.base)

    @property
    def hparams(self) -> dict[str, Any]:
        return dict(zip(self._group.names, self._values))

    @property
    def shards(self) -> int:
        """Trials its stream is split into (its method entry's `shards`; 1: not split). Not in its config."""
        return self._group.shards

    @property
    def config(self) -> RunConfig:
        return RunConfig.of_normal({**self._group.base, "hparams": self.hparams})

    @property
    def label(self) -> str:
        """A short human description: method, dataset, seed."""
        return f"{self.method} {self._group.base['dataset']} seed={self.source.seed}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.run_id == self.run_id

    def __hash__(self) -> int:
        return hash(self.run_id)

    def __repr__(self) -> str:
        return f"Run({self.run_id}, {self.label})"

    def __reduce__(self) -> tuple:
        return Run, (self.run_id, self.source, self._group, self._values)


class Shard(NamedTuple):
    """Shard `index` of `count` of one run's stream: a contiguous range of whole parts (so every part, and every
    call of the method on one, is the one the unsharded run makes)."""

    index: int
    count: int

    def rows(self, n: int, part_rows: int) -> tuple[int, int]:
        """[lo, hi): its stream positions in a stream of n samples written in parts of `part_rows` (the parts
        shared out as evenly as whole parts allow; a shard past the last part is empty)."""
        parts = -(-n // part_rows)
        return (min(n, part_rows * (self.index * parts // self.count)),
                min(n, part_rows * ((self.index + 1) * parts // self.count)))

    @property
    def label(self) -> str:
        return f"shard {self.index + 1}/{self.count}"


class Trial(NamedTuple):
    """One Tune trial (a tuple: a big grid has as many trials as runs, so they are kept small and quick to make)."""

    key: str                   # run_id of a single run; for a pack, a hash of its run_ids; <run_id>-shard<k>of<N>
    source: DataSource
    runs: tuple[Run, ...]
    shard: Shard | None = None  # one shard of its single run's stream (orchestrator.sweep.shard)
    # a replay trial's computed runs, one per configuration (its other runs are their orders: sweep.orders); ()
    # for any other trial
    replay: tuple[Run, ...] = ()


def _sources(spec: SweepSpec, dataset: RealDataset | SyntheticDataset, seed: int, views: str,
             templates: tuple[str, ...]) -> list[tuple[DataSource, dict]]:
    """The data sources of one dataset, seed, view setting and template sets, each with the run-config fields it
    implies: one per backbone and template set, times the stream protocols and their `orders`."""
    out = []
    for value in spec.streams:
        protocol = protocol_from_spec(value) if value is not None else None
        if isinstance(protocol, Continual) and dataset_name(dataset) != protocol.datasets[0]:
            continue  # a continual stream runs once, from its first dataset through the others
        for source, fields in _base_sources(spec, dataset, seed, views, templates):
            stream: dict[str, Any] = {}
            if protocol is not None:
                stream["stream"] = value  # in the config only when given, so earlier runs keep their run_ids
                source = replace(source, stream=canonical_json(value), others=_others(protocol))
                if isinstance(protocol, Continual):
                    stream["dataset"] = continual_name(protocol.datasets)
            for k in range(spec.orders) if spec.order is None else (spec.order,):
                order = {"order_index": k} if spec.orders > 1 else {}
                out.append((replace(source, order_index=k), {**fields, **stream, **order}))
    return out


def _at_batch(source: DataSource, fields: dict, batch_size: int, stream_batch: int | None = None
              ) -> tuple[DataSource, dict]:
    """A data source and its config fields for runs at `batch_size`: the size in the config (`normalize_config`
    leaves the default out) and a Dirichlet stream's slots from `stream_batch` (default: the batch size;
    `stream_for_batch`)."""
    stream_batch = batch_size if stream_batch is None else stream_batch
    fields = {**fields, "batch_size": batch_size}
    if stream_batch != 1 and "stream" in fields:
        stream = stream_for_batch(fields["stream"], stream_batch)
        if stream != fields["stream"]:
            fields = {**fields, "stream": stream}
            source = replace(source, stream=canonical_json(stream))
    return source, fields


def _realtime(fields: dict, source: DataSource, method: str) -> dict:
    """The config fields of a run on a realtime stream: its method's k (`realtime_k`; the stream's own k, else from
    the method's measured cost over CLIP's, `cost.realtime_k`), in the config, so it is recorded and in the run_id."""
    protocol = source.protocol()
    if not isinstance(protocol, Realtime):
        return fields
    card = method_card(method)
    views = parse_views(source.views).num_views if card.takes_views else 1
    k = protocol.k or costs.realtime_k(method, views, None if source.is_synthetic else source.model)
    return {**fields, "realtime_k": k}


def _steps(spec: SweepSpec, entry: Any, sizes: list[int]) -> list[tuple[int, int]]:
    """(batch size, batch size its stream is drawn for) of an entry's runs on a source whose entries run at
    `sizes`: its own sizes; the zero-shot baseline (batch size 1) also reads the stream of every batch size
    there, so a batch run's gain has its baseline on the same order (a Dirichlet order depends on it)."""
    own = [(b, b) for b in spec.entry_batch_sizes(entry)]
    if entry.method != baseline_method():
        return own
    return list(dict.fromkeys(own + [(1, b) for b in sizes]))


def _others(protocol: Protocol) -> tuple[str, ...]:
    """The datasets a stream reads besides the run's own: a contaminated stream's pool, a continual one's next."""
    if isinstance(protocol, Contaminated) and protocol.pool != HELD_OUT_CLASSES:
        return (protocol.pool,)
    if isinstance(protocol, Continual):
        return protocol.datasets[1:]
    return ()


def _base_sources(spec: SweepSpec, dataset: RealDataset | SyntheticDataset, seed: int, views: str,
                  templates: tuple[str, ...]) -> list[tuple[DataSource, dict]]:
    if isinstance(dataset, SyntheticDataset):
        params = dataset.params
        source = DataSource(dataset=dataset.dataset_name, seed=seed, synthetic=dataset.synthetic,
                            synthetic_params=canonical_json(params))
        fields = {"backbone": SYNTHETIC_BACKBONE, "pretrained": None, "templates": None,
                  "num_templates": params.get("templates_per_class", 1), "views": "single",
                  "synthetic": {"scenario": dataset.synthetic, **params}, "stream_order": "scenario"}
        return [(source, fields)]
    from orchestrator.sweep.catalog import effective_templates, published_tag, sigmoid_logits, template_counts

    out = []
    for backbone, asked in itertools.product(spec.backbones, templates):
        templates = effective_templates(asked, dataset.name, spec.data_root)[0]
        tag = None if backbone.pretrained == RANDOM_WEIGHTS else backbone.pretrained
        source = DataSource(dataset=dataset.name, seed=seed, views=views, model=backbone.model,
                            pretrained=tag, checkpoint=backbone.checkpoint,
                            model_config=backbone.config, quick_gelu=backbone.quick_gelu, templates=templates)
        # a checkpoint that is the published file is recorded as its tag (and the file), so the report sets it
        # beside the published numbers; any other checkpoint is recorded as its path, and never is
        published = published_tag(backbone.model, backbone.checkpoint) if backbone.checkpoint else None
        fields = {"backbone": backbone.model, "pretrained": published or source.weights or RANDOM_WEIGHTS,
                  **({"checkpoint": backbone.checkpoint} if published else {}), "templates": templates,
                  "num_templates": template_counts(templates, dataset.name)[0], "views": views,
                  "stream_order": "permutation", **_backbone_extras(backbone)}
        logits = sigmoid_logits(backbone.model, tag, backbone.checkpoint)
        if logits is not None:  # the backbone's own scale and bias, which its methods' sigmoid rules read
            fields["sigmoid"] = {"logit_scale": logits[0], "logit_bias": logits[1]}
        out.append((source, fields))
    return out


def _with_auxiliary(spec: SweepSpec, method: str, source: DataSource, fields: dict) -> tuple[DataSource, dict]:
    """A run of a method that reads auxiliary encoders: its source loads their features and its config records
    them (a synthetic dataset's are simulated: 'synthetic'); any other run is left as it was."""
    names = method_card(method).auxiliary
    if not names:
        return source, fields
    if source.is_synthetic:
        chosen = [{"name": name, "synthetic": True} for name in names]
        recorded = {name: "synthetic" for name in names}
    else:
        backbone = next(b for b in spec.backbones if b.model == source.model and b.checkpoint == source.checkpoint
                        and (None if b.pretrained == RANDOM_WEIGHTS else b.pretrained) == source.pretrained)
        chosen = [{"name": a.name, "arch": a.arch, "checkpoint": a.checkpoint} for a in backbone.auxiliary
                  if a.name in names]
        recorded = {a["name"]: f"{a['arch']}/{a['checkpoint'] or RANDOM_WEIGHTS}" for a in chosen}
    return replace(source, auxiliary=canonical_json(chosen)), {**fields, "auxiliary": recorded}


@functools.lru_cache(maxsize=None)
def _context_file(path: str, stamp: tuple[int, int]) -> tuple[str, str]:
    from orchestrator.clip.backbone import file_sha256
    from orchestrator.clip.context import context_source

    return file_sha256(path), context_source(path)


def _learned_context(path: str) -> tuple[str, str]:
    """A context file's sha256 and format (CoOp or MaPLe), read once per version of the file (a plan asks per
    source and entry)."""
    stat = os.stat(path)
    return _context_file(path, (stat.st_mtime_ns, stat.st_size))


def _context_fields(entry: Any) -> dict[str, Any]:
    """Run-config keys of a method entry's learned context (none without one): the file, and its content's hash,
    which the runs table carries so that tables never mix starting points; so too PromptAlign's source statistics
    files (`<field>`, `<field>_sha256`)."""
    from orchestrator.clip.backbone import file_sha256

    fields = {} if entry.context is None else {"context": entry.context,
                                               "context_sha256": _learned_context(entry.context)[0]}
    for name in STATISTICS_FIELDS:
        path = getattr(entry, name, None)
        if path is not None:
            fields.update({name: path, f"{name}_sha256": file_sha256(path)})
    return fields


def _with_context(entry: Any, source: DataSource) -> DataSource:
    """A frozen-feature method's context gives its class embeddings (CoOp's prompts) or prompts both encoders its
    features come from (MaPLe's), so its runs read a source of their own; a method running the text tower itself
    starts from it there (`pieces.PromptTexts`: a prompt-tuning method's CoOp context, PromptAlign's MaPLe prompts),
    on the plain source."""
    if entry.context is None or source.is_synthetic or method_card(entry.method).takes_text:
        return source
    sha256, kind = _learned_context(entry.context)
    return replace(source, context=entry.context, context_sha256=sha256, context_source=kind)


def _backbone_extras(backbone: Backbone) -> dict[str, Any]:
    """Run-config keys a backbone sets only when used: the activation override, a custom config's content, a
    checkpoint's content hash (its path alone would let two different fine-tunings read as one)."""
    extras: dict[str, Any] = {}
    if backbone.checkpoint is not None:
        from orchestrator.clip.backbone import file_sha256

        extras["weights_sha256"] = file_sha256(backbone.checkpoint)
    if backbone.quick_gelu is not None:
        extras["quick_gelu"] = backbone.quick_gelu
    if backbone.config is not None:
        extras["model_config_sha256"] = hashlib.sha256(Path(backbone.config).read_bytes()).hexdigest()[:16]
    return extras


def _grid_on(entry: Any, fields: dict[str, Any]) -> dict[str, list[Any]]:
    """A method entry's grid on a data source: on a sigmoid-scored backbone, a method whose card's rule is
    'backbone_scale' takes the backbone's learned logit scale where the entry gives none
    (`orchestrator.registry.card.SIGMOID_RULES`; a 'refuse' method never gets here: the checks refuse it)."""
    grid = method_grid(entry)
    head = fields.get("sigmoid")
    if head is not None and "logit_scale" not in grid and method_card(entry.method).sigmoid_rule.rule == "backbone_scale":
        grid["logit_scale"] = [head["logit_scale"]]
    return grid


def _entries_by_inputs(spec: SweepSpec, dataset: RealDataset | SyntheticDataset
                      ) -> dict[tuple[str, tuple[str, ...]], list[Any]]:
    """The method entries that run on a dataset, grouped by the views and template sets each runs on (in entry
    order)."""
    groups: dict[tuple[str, tuple[str, ...]], list[Any]] = {}
    for entry in spec.methods:
        if dataset in entry_datasets(spec, entry):
            key = (dataset_views(spec, dataset, entry.method), tuple(method_templates(spec, entry.method)))
            groups.setdefault(key, []).append(entry)
    return groups


def template_notes(spec: SweepSpec) -> list[str]:
    """What the plan says of template sets it could not use as asked (a missing CuPL prompt file)."""
    if not spec.has_real_datasets:
        return []
    from orchestrator.sweep.catalog import effective_templates

    sets = dict.fromkeys(t for entry in spec.methods for t in method_templates(spec, entry.method))
    notes = [effective_templates(t, d.name, spec.data_root)[1] for d in spec.datasets if isinstance(d, RealDataset)
             for t in sets]
    return [n for n in notes if n]


def data_sources(spec: SweepSpec) -> list[DataSource]:
    """Every distinct data source of the spec (what `bca cache` encodes and trials load), in expansion order."""
    out: dict[DataSource, None] = {}
    for dataset in spec.datasets:
        for (views, templates), entries in _entries_by_inputs(spec, dataset).items():
            sizes = list(dict.fromkeys(b for entry in entries for b in spec.entry_batch_sizes(entry)))
            for seed in spec.seeds:
                for source, fields in _sources(spec, dataset, seed, views, templates):
                    out.update(dict.fromkeys(_with_context(entry, _at_batch(source, fields, b)[0])
                                             for entry in entries for b in sizes))
    return list(out)


def iter_runs(spec: SweepSpec) -> Iterator[Run]:
    """Every run of the spec, in the fixed expansion order, one at a time. A config that two method entries
    both give (e.g. the shared centre of one-at-a-time sensitivity grids) is one run."""
    seen: set[str] = set()
    for dataset in spec.datasets:
        groups = _entries_by_inputs(spec, dataset)
        # what depends on the entry (and a sigmoid backbone's scale) but not on the seed, order or stream: made
        # once, as a study's 10^5 runs are mostly groups of one run (one per order)
        axes: dict[tuple[int, str], tuple[tuple[str, ...], list]] = {}
        steps = {id(entry): _steps(spec, entry, list(dict.fromkeys(
            b for other in entries for b in spec.entry_batch_sizes(other))))
            for entries in groups.values() for entry in entries}
        context = {id(entry): _context_fields(entry) for entries in groups.values() for entry in entries}
        for seed in spec.seeds:
            for (views, templates), entries in groups.items():
                for plain_source, plain_fields in _sources(spec, dataset, seed, views, templates):
                    for entry in entries:
                        key = (id(entry), repr(plain_fields.get("sigmoid")))
                        if key not in axes:
                            axes[key] = method_card(entry.method).grid_axes(
                                _grid_on(entry, plain_fields), None if plain_source.is_synthetic
                                else plain_source.dataset)
                        names, grids = axes[key]
                        for batch_size, stream_batch in steps[id(entry)]:
                            source, fields = _with_auxiliary(spec, entry.method, *_at_batch(
                                _with_context(entry, plain_source), plain_fields, batch_size, stream_batch))
                            fields = _realtime(fields, source, entry.method)
                            base = normalize_config({"sweep": spec.name, "dataset": source.dataset,
                                                     "method": entry.method, "seed": seed, **fields,
                                                     **context[id(entry)]})
                            del base["hparams"]
                            group = _Group(base, names, entry.shards or 1)
                            # a point two sub-grids share (the card's `grid_points` gives it once) is one run
                            for run_id, values in grid_run_ids(base, names, grids):
                                if run_id not in seen:
                                    seen.add(run_id)
                                    yield Run(run_id, source, group, values)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a plan is built: it would rescan the ever larger heap of new,
    acyclic runs and trials again and again (most of the time a big grid's plan took)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def expand(spec: SweepSpec) -> list[Run]:
    """Every run of the spec (see iter_runs), runs sharing a data source brought together (stable), so a trial
    process reuses loaded features. Runs come in groups of one source, so a source is hashed once per group."""
    with _gc_paused():
        by_source: dict[DataSource, list[Run]] = {}
        last, bucket = None, []
        for run in iter_runs(spec):
            if run.source is not last:
                last, bucket = run.source, by_source.setdefault(run.source, [])
            bucket.append(run)
        return [run for runs in by_source.values() for run in runs]


def make_trials(runs: list[Run], pack: int | str, cost: Callable[[Run], float] | None = None,
                memory: tuple[float, Callable[[Run], int]] | None = None) -> list[Trial]:
    """Group runs into trials: singletons, packs of up to `pack` runs, or with pack 'auto' packs sized by `cost`
    (seconds a run takes; default the prior cost model, see orchestrator.sweep.cost), or on a GPU by `memory`
    (a pack's budget in bytes and each run's bytes: `cost.memory_chunks`), of runs sharing a data source
    and the kind of features they take (runs taking views are packed only with runs taking views)."""
    if pack == "auto" and memory is not None:
        chunk = functools.partial(costs.memory_chunks, budget_bytes=memory[0], bytes_of=memory[1])
    elif pack == "auto":
        chunk = functools.partial(costs.chunk_by_cost, cost=cost or costs.cost_model(_synthetic_or_unknown_length))
    elif isinstance(pack, int) and not isinstance(pack, bool) and pack >= 1:
        chunk = functools.partial(_chunk_fixed, pack=pack)
    else:
        raise ValueError(f"pack: expected a positive integer or 'auto', got {pack!r}")
    with _gc_paused():
        return _make_trials(runs, chunk)


def _synthetic_or_unknown_length(source: DataSource) -> int:
    return int(source.params()["n"]) if source.is_synthetic else costs.UNKNOWN_LENGTH


def _chunk_fixed(group: list[Run], pack: int) -> list[tuple[Run, ...]]:
    return [tuple(group[start:start + pack]) for start in range(0, len(group), pack)]


def teacher_source(source: DataSource, teacher: str) -> DataSource:
    """The data source of a run's CLIP teacher (`orchestrator.registry.backbones.TEACHER`): the teacher backbone at
    its published weights on the same images, views and stream, its class prompts the one template its code
    encodes ('tpt1': "a photo of a {name}.")."""
    from orchestrator.sweep.catalog import teacher_backbone

    model, pretrained = teacher_backbone(teacher)
    return replace(source, model=model, pretrained=pretrained, checkpoint=None, model_config=None, quick_gelu=None,
                   templates="tpt1", auxiliary="", context=None, context_sha256=None)


def _make_trials(runs: list[Run], chunk: Callable[[list[Run]], list[tuple[Run, ...]]]) -> list[Trial]:
    groups: dict[tuple[DataSource, bool], list[Run]] = {}  # by the source's first order: its orders pack together
    # per run group (one source, one method entry), made and hashed once: None where its runs are never packed,
    # else its source's first order, its card, and whether it takes views (None: its hparams decide, per run)
    keys: dict[int, tuple[DataSource, MethodCard, bool | None] | None] = {}
    trials: list[Trial] = []
    alone: dict[tuple, list[Run]] = {}  # never packed: a configuration's orders (one computation if order-free)
    free: dict[str, bool] = {}
    bases: dict[int, str] = {}
    for run in runs:
        if run.shards > 1:  # a sharded run is never packed: one trial per shard
            trials += [Trial(f"{run.run_id}-shard{k + 1}of{run.shards}", run.source, (run,), Shard(k, run.shards))
                       for k in range(run.shards)]
            continue
        known = keys.get(id(run._group), False)
        if known is False:
            card = method_card(run.method)
            # never packed: its encoder is its own, it reads auxiliary (or a teacher's) features a pack does not
            # pass, or it interleaves adapting and frozen steps (a realtime stream); a method taking views or not
            # whatever its hparams decides once per group, one whose hparams decide it (inputs 'either') per run
            known = keys[id(run._group)] = None if (
                card.image_encoder is not None or bool(card.auxiliary) or names_teacher(card)
                or "realtime_k" in run._group.base) else (
                replace(run.source, order_index=0), card,
                None if card.inputs == "either" else run.source.views != "single" and card.takes_views)
        if known is None:
            alone.setdefault(order_class(run, bases), []).append(run)
            continue
        first, card, views = known
        if views is None:
            views = run.source.views != "single" and card.wants_views(run.hparams)
        groups.setdefault((first, views), []).append(run)
    for group in groups.values():
        trials += _order_trials(group, chunk)
    for members in alone.values():
        trials += _alone_trials(members, free)
    return trials


def _alone_trials(members: list[Run], free: dict[str, bool]) -> list[Trial]:
    """The trials of a configuration whose runs are never packed (`_make_trials`), over its stream orders: one per
    run, but an order-free method off a realtime stream (RLCF, which reads a teacher's features a pack does not
    pass) computes once and replays the computation in every order, as a pack's order-free runs do."""
    first = members[0]
    if first.method not in free:
        from orchestrator.methods.episodic import order_free

        free[first.method] = order_free(first.method) and method_card(first.method).image_encoder is None
    if len(members) == 1 or not free[first.method] or "realtime_k" in first._group.base:
        return [Trial(run.run_id, run.source, (run,)) for run in members]
    return [Trial(_trial_key(tuple(members)), first.source, tuple(members), replay=(first,))]


def order_class(run: Run, bases: dict[int, str] | None = None) -> tuple[str, str]:
    """What a run shares with the same configuration's runs over the other orders of its data source: its whole
    config but the order (`bases` memoises the config without hparams per run group while a plan is made)."""
    bases = {} if bases is None else bases
    base = bases.get(id(run._group))
    if base is None:
        base = bases[id(run._group)] = canonical_json({k: v for k, v in run._group.base.items()
                                                       if k != "order_index"})
    return base, canonical_json(run.hparams)


def _order_trials(group: list[Run], chunk: Callable[[list[Run]], list[tuple[Run, ...]]]) -> list[Trial]:
    """Trials of the runs of one data source's orders (orchestrator.sweep.orders), a configuration's orders next
    to each other: an order-free method's configurations chunked by their own cost (one run standing for each)
    with every order of each in the trial, since one computation serves them all (`replay`); any other run
    chunked as a pack is, its orders stepped in one pass."""
    if len({run.source for run in group}) == 1:
        return [Trial(_trial_key(members), members[0].source, members) for members in chunk(group)]
    from orchestrator.methods.episodic import order_free

    classes: dict[tuple, list[Run]] = {}
    bases: dict[int, str] = {}
    for run in group:
        classes.setdefault(order_class(run, bases), []).append(run)
    free = {method: order_free(method) for method in {run.method for run in group}}
    trials = []
    replayed = [runs for runs in classes.values() if free[runs[0].method]]
    by_first = {id(runs[0]): runs for runs in replayed}
    for members in chunk([runs[0] for runs in replayed]):
        every = tuple(run for first in members for run in by_first[id(first)])
        trials.append(Trial(_trial_key(every), every[0].source, every, replay=members))
    stepped = [run for runs in classes.values() if not free[runs[0].method] for run in runs]
    trials += [Trial(_trial_key(members), members[0].source, members) for members in chunk(stepped)]
    return trials


def computed_runs(trial: Trial) -> tuple[Run, ...]:
    """The runs a trial's method passes compute: a replay trial's one per configuration, else all of them."""
    return trial.replay or trial.runs


def _trial_key(members: tuple[Run, ...]) -> str:
    if len(members) == 1:
        return members[0].run_id
    return "pack-" + hashlib.sha256(",".join(r.run_id for r in members).encode()).hexdigest()[:16]
