"""The one place that knows the results layout: Parquet columns and types, the run config, paths.

Layout under a results dir (hive-style partitions; values percent-encoded so any name is a safe path part):
    samples/sweep=<s>/backbone=<b>/dataset=<d>/method=<m>/run_id=<id>/part-<start:09d>.parquet
    runs/sweep=<s>/run_id=<id>.parquet          one row per run, rewritten atomically on each status change
    artifacts/<run_id>/state.npz                final V, C1, C2, class_ids (and U) of a run
    catalog/manifest.json                       the segments that hold compacted runs (orchestrator.results.store)
    catalog/segments/<seg>.samples.parquet      many finished runs' rows, sorted by (run_id, sample_idx)
    catalog/segments/<seg>.runs.parquet         those runs' runs-table rows
    catalog/segments/<seg>.metrics.parquet      their per-run metrics, computed from the rows when compacted
A run is in one place: its own files while it is written (the live layout above), a segment once compacted.

A run config is a dict:
    sweep, backbone, dataset, method: non-empty str;  seed: int          (required)
    pretrained: str | None; templates: str | None; num_templates: int | None; views: str | int | None
    weights_sha256, context_sha256: str, present only for a checkpoint file / a learned context (with `context`,
                             its path), so every other run keeps its run_id; so too vis_means_sha256 and
                             vis_vars_sha256 (with `vis_means`, `vis_vars`), PromptAlign's source statistics files
    batch_size: int >= 1, present only when it is not 1 (so every per-sample run keeps its run_id)
    realtime_k: int >= 1, present only on a realtime stream: the method adapts on every k-th sample
    hparams: {name: value}   every method hparam (defaults filled), one runs-table column each (typed by the
                             method registry's cards; names no card declares are typed from their value)
    any other key (e.g. synthetic scenario parameters): kept in config_json and in the hashes
run_id = config_hash = first 16 hex chars of sha256 over the canonical JSON of the normalised config.
Code reads a run's config as a `RunConfig`: normalised once when made, typed attributes (method, hparams,
batch_size with its default, stream, ...), and as a Mapping the dict above.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping
from urllib.parse import quote

import pyarrow as pa

from orchestrator import registry
from orchestrator.registry.card import coerce_kind
from orchestrator.results.metrics import RUN_METRICS
from orchestrator.stages import STAGE_DOCS, STAGES, stage_column

SCHEMA_VERSION = "1"
DEFAULT_RESULTS_DIR = "results"

# A run's batch size where its config names none: a per-sample run's config leaves it out, so that every run
# from before batches existed keeps its run_id (`normalize_config`, `batch_size_of`).
DEFAULT_BATCH_SIZE = 1

# Keys in every Parquet file's key-value metadata.
META_RUN_CONFIG = b"bca.run_config"
META_RUN_ID = b"bca.run_id"
META_SCHEMA_VERSION = b"bca.schema_version"
META_KIND = b"bca.kind"


@dataclass(frozen=True)
class Column:
    name: str
    arrow: pa.DataType
    sql: str  # the DuckDB type the views cast to, so every view has fixed types even over hand-made files
    doc: str
    # what a run whose file lacks the column (written before it existed) or leaves it null reads as; None: null
    missing: Any = None


# --------------------------------------------------------------------------------------------- samples
SAMPLE_COLUMNS: tuple[Column, ...] = (
    Column("run_id", pa.string(), "VARCHAR", "run the row belongs to"),
    Column("sample_idx", pa.int64(), "BIGINT", "position in the stream (0-based)"),
    Column("image_id", pa.string(), "VARCHAR", "dataset's id of the image"),
    Column("label", pa.int32(), "INTEGER", "true class"),
    Column("pred", pa.int32(), "INTEGER", "predicted class (argmax of the posterior)"),
    Column("correct", pa.bool_(), "BOOLEAN", "pred == label"),
    Column("confidence", pa.float32(), "FLOAT", "max posterior"),
    Column("gated", pa.bool_(), "BOOLEAN", "the likelihood / cache update fired"),
    Column("gated_prior", pa.bool_(), "BOOLEAN", "the prior update fired"),
    Column("selected", pa.int32(), "INTEGER", "class embedding selected for the update, -1 if none"),
    Column("top5", pa.list_(pa.int32()), "INTEGER[]", "the min(5, K) most probable classes, best first"),
    Column("prob_true", pa.float32(), "FLOAT", "posterior of the true class (null for an OOD sample)"),
    Column("is_ood", pa.bool_(), "BOOLEAN", "from outside the label space (contaminated streams): label -1, "
                                            "left out of accuracy"),
    Column("source", pa.string(), "VARCHAR", "dataset the sample comes from (continual and contaminated streams)"),
)
# Null where the writer was not given them: parts written before these columns existed read as null too.
SAMPLE_NULLABLE = ("top5", "prob_true", "source")
SAMPLE_ARROW_SCHEMA = pa.schema([pa.field(c.name, c.arrow, nullable=c.name in SAMPLE_NULLABLE)
                                 for c in SAMPLE_COLUMNS])
# A part lacking one of these cannot answer the views' questions and is reported as bad.
SAMPLE_REQUIRED = ("run_id", "sample_idx", "label", "pred", "correct")
# What write_part fills when the method has no such notion (e.g. CLIP never gates).
SAMPLE_DEFAULTS: dict[str, Any] = {"gated": False, "gated_prior": False, "selected": -1, "is_ood": False}
PARTITION_KEYS = ("sweep", "backbone", "dataset", "method", "run_id")
# What a run starts from beside the backbone (a learned context, PromptAlign's source statistics): runs of different
# ones are rows apart in every table, never configurations of one row
STARTING_POINT = ("context_sha256", "vis_means_sha256", "vis_vars_sha256")

# ------------------------------------------------------------------------------------------------ runs
IDENTITY_COLUMNS: tuple[Column, ...] = (
    Column("sweep", pa.string(), "VARCHAR", "sweep name"),
    Column("backbone", pa.string(), "VARCHAR", "open_clip model name"),
    Column("pretrained", pa.string(), "VARCHAR", "open_clip pretrained tag or checkpoint, null = random"),
    Column("weights_sha256", pa.string(), "VARCHAR", "sha256 of the backbone's checkpoint file (fine-tuned weights "
                                                     "such as TeCoA's); null for a tag or random weights"),
    Column("context_sha256", pa.string(), "VARCHAR", "sha256 of the learned context file the run started from "
                                                     "(CoOp's for a prompt-tuning run, CoOp's or MaPLe's for a "
                                                     "frozen-feature one, MaPLe's for PromptAlign); null: the "
                                                     "hand-written prompt"),
    Column("vis_means_sha256", pa.string(), "VARCHAR", "sha256 of PromptAlign's source means file (vis_means) the "
                                                       "run aligned with; null: none"),
    Column("vis_vars_sha256", pa.string(), "VARCHAR", "sha256 of PromptAlign's source variances file (vis_vars) "
                                                      "the run aligned with; null: none"),
    Column("dataset", pa.string(), "VARCHAR", "dataset or synthetic scenario name"),
    Column("method", pa.string(), "VARCHAR", "method name (a card of orchestrator.registry)"),
    Column("seed", pa.int64(), "BIGINT", "stream seed"),
    Column("templates", pa.string(), "VARCHAR", "template set name"),
    Column("num_templates", pa.int64(), "BIGINT", "templates per class"),
    Column("views", pa.string(), "VARCHAR", "view setting (e.g. 1, 64 or a named set)"),
    Column("stream", pa.string(), "VARCHAR", "stream protocol as the spec gave it (JSON); null = the dataset's own "
                                             "order (a seeded shuffle of a real dataset)"),
    Column("order_index", pa.int64(), "BIGINT", "which of the configuration's `orders` (null: the only one)"),
    Column("batch_size", pa.int64(), "BIGINT", "samples per adaptation step: 1 for a per-sample run (and every run "
                                               "stored before batches existed), else a batch method's batch size",
           missing=DEFAULT_BATCH_SIZE),
)
_OOD_AUROC = [m.name for m in RUN_METRICS].index("ood_auroc")
# What RunWriter.mark accepts as keyword arguments.
METRIC_COLUMNS: tuple[Column, ...] = (
    Column("n_samples", pa.int64(), "BIGINT", "length of the run's stream"),
    Column("error", pa.string(), "VARCHAR", "error of a failed run"),
    # the registry's metrics (orchestrator.results.metrics); n_ood keeps its place before ood_auroc, the order
    # files have always had (the metrics registered after ood_auroc follow it)
    *(Column(m.name, pa.float64(), "DOUBLE", m.doc) for m in RUN_METRICS[:_OOD_AUROC]),
    Column("n_ood", pa.int64(), "BIGINT", "OOD samples in the stream (contaminated streams), left out of accuracy"),
    *(Column(m.name, pa.float64(), "DOUBLE", m.doc) for m in RUN_METRICS[_OOD_AUROC:]),
    Column("samples_per_s", pa.float64(), "DOUBLE", "throughput of the online loop"),
    Column("warmup_s", pa.float64(), "DOUBLE", "seconds of the first call of the run's code in its process (JIT "
                                               "compilation, lazy set-up), on throwaway state; not in samples_per_s "
                                               "or the stage times; 0 once warm"),
    *(Column(stage_column(s), pa.float64(), "DOUBLE", STAGE_DOCS[s]) for s in STAGES),
    Column("progress", pa.string(), "VARCHAR", "how far a running run got, e.g. 'encoding 120/500 images' or "
                                               "'adapting 3000/10000 samples' (null once it ends)"),
    Column("peak_mem_mb", pa.float64(), "DOUBLE", "the trial's own peak memory, MiB: the GPU allocator's peak, or "
                                                  "on the CPU the growth of the process's resident size"),
    Column("latency_ms", pa.float64(), "DOUBLE", "milliseconds per sample of the run's method, warm-up apart: in a "
                                                 "pack, its share of its own method's pass (null: run before it was "
                                                 "measured)"),
    Column("method_mem_mb", pa.float64(), "DOUBLE", "peak memory of the run's method above what was allocated when "
                                                    "it began, MiB (in a pack, its share of its method's pass; null: "
                                                    "not measured)"),
    Column("n_skipped", pa.int64(), "BIGINT", "images left out of the stream as unreadable"),
    Column("skipped", pa.string(), "VARCHAR", "JSON list of the unreadable images: {image_id, reason}"),
    Column("data_fingerprint", pa.string(), "VARCHAR",
           "sha256 (16 hex) of the real dataset's image list the run streamed; null for synthetic data"),
)
HEAD_COLUMNS: tuple[Column, ...] = (
    Column("run_id", pa.string(), "VARCHAR", "= config_hash"),
    Column("config_hash", pa.string(), "VARCHAR", "sha256 of the canonical config, 16 hex"),
    Column("group_id", pa.string(), "VARCHAR", "hash of the config without seed: runs that differ only by seed"),
    Column("setting_id", pa.string(), "VARCHAR",
           "hash of the config without sweep, method, hparams and seed: the data CLIP's baseline must share"),
)
STATUS_COLUMN = Column("status", pa.string(), "VARCHAR", "running, finished or failed")
TAIL_COLUMNS: tuple[Column, ...] = (
    Column("host", pa.string(), "VARCHAR", "hostname of the writer"),
    Column("versions", pa.string(), "VARCHAR", "JSON of package versions"),
    Column("started_at", pa.timestamp("us", tz="UTC"), "TIMESTAMPTZ", "first time marked running"),
    Column("finished_at", pa.timestamp("us", tz="UTC"), "TIMESTAMPTZ", "time marked finished or failed"),
    Column("updated_at", pa.timestamp("us", tz="UTC"), "TIMESTAMPTZ", "time of the last status change"),
    Column("config_json", pa.string(), "VARCHAR", "the full normalised run config"),
)
RUN_REQUIRED = ("run_id", "sweep", "backbone", "dataset", "method", "seed", "status")
STATUSES = ("running", "finished", "failed")
METRIC_NAMES = tuple(c.name for c in METRIC_COLUMNS)
_KIND_TYPES = {"float": (pa.float64(), "DOUBLE"), "int": (pa.int64(), "BIGINT"), "str": (pa.string(), "VARCHAR"),
               "bool": (pa.bool_(), "BOOLEAN")}


# The `pretrained` a run stores for a backbone with random weights on purpose (a spec's `pretrained: random`).
RANDOM_WEIGHTS = "random"

def hparam_columns() -> tuple[Column, ...]:
    """One column per hparam of every registered method, typed by its card (methods sharing a name share it)."""
    docs = registry.hparam_docs()
    return tuple(Column(name, *_KIND_TYPES[kind], docs[name]) for name, kind in registry.hparam_kinds().items())


def run_columns() -> tuple[Column, ...]:
    """The runs table's columns: identity, every registered hparam, status and metrics, bookkeeping."""
    return (HEAD_COLUMNS + IDENTITY_COLUMNS + hparam_columns() + (METRIC_COLUMNS[0], STATUS_COLUMN)
            + METRIC_COLUMNS[1:] + TAIL_COLUMNS)


_FIXED_RUN_NAMES = frozenset(c.name for c in HEAD_COLUMNS + IDENTITY_COLUMNS + METRIC_COLUMNS + TAIL_COLUMNS
                             + (STATUS_COLUMN,))

REQUIRED_CONFIG_KEYS = ("sweep", "backbone", "dataset", "method", "seed")
OPTIONAL_CONFIG_KEYS = ("pretrained", "templates", "num_templates", "views", "hparams")
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RUN_ID_RE = re.compile(r"^[0-9a-f]{16}$")


# ---------------------------------------------------------------------------------------------- config
def _plain(value: Any, where: str) -> Any:
    """Python scalars/lists/dicts only (numpy scalars unwrapped), so the canonical JSON is stable."""
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 0) == 0:
        value = value.item()
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"run config {where}: expected a finite number, got {value!r}")
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise ValueError(f"run config {where}: expected a JSON value (str, number, bool, None, list, dict), "
                     f"got {type(value).__name__} {value!r}")


def _as_int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"run config {where}: expected an integer, got {value!r}")
    return int(value)


def _coerce_hparam(name: str, value: Any, kinds: Mapping[str, str]) -> Any:
    """Registered hparams take their card's kind (`registry.card.coerce_kind`); others pass as is."""
    kind = kinds.get(name)
    if value is None or kind is None:
        return value
    try:
        return coerce_kind(kind, value)
    except ValueError as exc:
        raise ValueError(f"run config hparams.{name}: {exc}, got {value!r}") from None


def normalize_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Validate a run config and return it in canonical form (the form that is hashed and stored)."""
    if isinstance(config, RunConfig):  # normalised when it was made
        return {**config._data, "hparams": dict(config._data["hparams"])}
    if not isinstance(config, Mapping):
        raise ValueError(f"run config: expected a dict, got {type(config).__name__}")
    cfg = _plain(dict(config), "config")
    for key in ("run_id", "config_hash"):
        if key in cfg:
            raise ValueError(f"run config: {key!r} is derived from the config and must not be part of it")
    for key in REQUIRED_CONFIG_KEYS:
        if key not in cfg or cfg[key] is None:
            raise ValueError(f"run config: missing required key {key!r} (required: {list(REQUIRED_CONFIG_KEYS)})")
    for key in ("sweep", "backbone", "dataset", "method"):
        if not isinstance(cfg[key], str) or not cfg[key]:
            raise ValueError(f"run config {key}: expected a non-empty string, got {cfg[key]!r}")
    cfg["seed"] = _as_int(cfg["seed"], "seed")
    for key in ("pretrained", "templates"):
        if cfg.get(key) is not None and not isinstance(cfg[key], str):
            raise ValueError(f"run config {key}: expected a string or null, got {cfg[key]!r}")
        cfg.setdefault(key, None)
    cfg["num_templates"] = None if cfg.get("num_templates") is None else _as_int(cfg["num_templates"],
                                                                                   "num_templates")
    views = cfg.get("views")
    if views is not None and (isinstance(views, bool) or not isinstance(views, (str, int))):
        raise ValueError(f"run config views: expected a string or an integer, got {views!r}")
    cfg["views"] = None if views is None else str(views)
    if "batch_size" in cfg:
        cfg["batch_size"] = _as_int(cfg["batch_size"], "batch_size")
        if cfg["batch_size"] < 1:
            raise ValueError(f"run config batch_size: expected an integer >= 1, got {cfg['batch_size']}")
        if cfg["batch_size"] == DEFAULT_BATCH_SIZE:
            del cfg["batch_size"]  # left out so a run's id does not depend on spelling the default
    hparams = cfg.get("hparams") or {}
    if not isinstance(hparams, dict):
        raise ValueError(f"run config hparams: expected a dict of name -> value, got {hparams!r}")
    clean = {}
    kinds = registry.hparam_kinds()
    for name, value in hparams.items():
        if not _NAME_RE.match(name):
            raise ValueError(f"run config hparams: {name!r} is not a valid column name (letters, digits, _)")
        if name in _FIXED_RUN_NAMES:
            raise ValueError(f"run config hparams: {name!r} collides with the runs-table column of that name")
        clean[name] = _coerce_hparam(name, value, kinds)
    cfg["hparams"] = dict(sorted(clean.items()))
    return cfg


_HPARAMS_SLOT = "\x00hparams\x00"  # stands for the hparams object in `grid_run_ids`


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def batch_size_of(config: Mapping[str, Any]) -> int:
    """A run config's batch size (`DEFAULT_BATCH_SIZE` where it names none)."""
    return config.get("batch_size", DEFAULT_BATCH_SIZE)


def canonical_json(config: Mapping[str, Any]) -> str:
    return _CANONICAL.encode(config)


def run_id_of(normalized: Mapping[str, Any]) -> str:
    """16 hex chars of sha256 over the canonical JSON of a config in normal form (`normalize_config`'s output, or
    the plan's: a normalised config and hparams its card resolved, `MethodCard.grid_points`): the one hash of a
    run's identity and of its groups."""
    return hashlib.sha256(canonical_json(normalized).encode("utf-8")).hexdigest()[:16]


def grid_run_ids(base: Mapping[str, Any], names: tuple[str, ...], grids: Iterable[tuple[tuple[Any, ...], ...]]
                 ) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """(`run_id_of({**base, "hparams": dict(zip(names, values))})`, values) for the values of each grid's product
    in turn (a grid: one tuple of values per name; `names` sorted, values in normal form: a card's `grid_axes`),
    a point that two grids share once per grid. A big grid's plan would spend most of its time writing JSON, so
    what is written once is: the canonical JSON around the hparams object (sorted keys put that object in the
    same place whatever it holds), hashed once, and each name's and value's JSON, once per grid; a point's is
    their product, joined."""
    if list(names) != sorted(names):
        raise ValueError(f"grid_run_ids: names must be sorted as the canonical JSON sorts them, got {names!r}")
    prefix, suffix = canonical_json({**base, "hparams": _HPARAMS_SLOT}).split(json.dumps(_HPARAMS_SLOT), 1)
    head = hashlib.sha256(prefix.encode("utf-8"))
    keys = [canonical_json(name) + ":" for name in names]
    for grid in grids:
        if all(len(values) == 1 for values in grid):  # one point (a study's usual group): one JSON call, not one a name
            point = tuple(values[0] for values in grid)
            digest = head.copy()
            digest.update((canonical_json(dict(zip(names, point))) + suffix).encode("utf-8"))
            yield digest.hexdigest()[:16], point
            continue
        fragments = [[key + canonical_json(value) for value in values] for key, values in zip(keys, grid)]
        for values, parts in zip(itertools.product(*grid), itertools.product(*fragments)):
            digest = head.copy()
            digest.update(("{" + ",".join(parts) + "}" + suffix).encode("utf-8"))
            yield digest.hexdigest()[:16], values


def config_hash(config: Mapping[str, Any]) -> str:
    """run_id of a config: `run_id_of` its normal form."""
    return run_id_of(normalize_config(config))


def group_id(config: Mapping[str, Any]) -> str:
    """Same for every seed and stream order of one configuration: the summary view aggregates over it."""
    cfg = normalize_config(config)
    cfg.pop("seed")
    cfg.pop("order_index", None)
    return run_id_of(cfg)


def setting_id(config: Mapping[str, Any]) -> str:
    """Same for every method, hparam setting, seed and sweep on one backbone/dataset/templates/views/data
    setting: zero-shot CLIP with this id is the baseline a method's gain is measured against."""
    cfg = normalize_config(config)
    # batch_size and realtime_k are the method's step, not the data: a batch run's baseline is CLIP on the same
    # order (a Dirichlet order that depends on the batch size says so in its stream)
    for key in ("seed", "method", "hparams", "sweep", "order_index", "batch_size", "realtime_k"):
        cfg.pop(key, None)
    return run_id_of(cfg)


class RunConfig(Mapping[str, Any]):
    """A run's config, typed: normalised once when made (`normalize_config`; a RunConfig is taken as it is), then
    read by attribute. As a Mapping it is its stored form: what `run_id_of` hashes and config_json holds."""

    __slots__ = ("_data",)

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._data = config._data if isinstance(config, RunConfig) else normalize_config(config)

    @classmethod
    def of_normal(cls, normalized: dict[str, Any]) -> RunConfig:
        """One taken as it is, from a config already in normal form (the plan's: a normalised base and the hparams
        its card resolved, what `run_id_of` hashes): validating 10^5 planned runs' configs again would be most of
        a big dry run."""
        config = cls.__new__(cls)
        config._data = normalized
        return config

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"RunConfig({self._data!r})"

    @property
    def sweep(self) -> str:
        return self._data["sweep"]

    @property
    def backbone(self) -> str:
        return self._data["backbone"]

    @property
    def dataset(self) -> str:
        return self._data["dataset"]

    @property
    def method(self) -> str:
        return self._data["method"]

    @property
    def seed(self) -> int:
        return self._data["seed"]

    @property
    def hparams(self) -> dict[str, Any]:
        """Every hparam of its method, sorted by name (a copy)."""
        return dict(self._data["hparams"])

    @property
    def batch_size(self) -> int:
        return batch_size_of(self._data)

    @property
    def num_templates(self) -> int | None:
        return self._data["num_templates"]

    @property
    def stream(self) -> Any:
        """The stream as the spec gave it (None: the dataset's own order)."""
        return self._data.get("stream")

    @property
    def order_index(self) -> int | None:
        return self._data.get("order_index")

    @property
    def realtime_k(self) -> int | None:
        """On a realtime stream, the method adapts on every k-th sample (None: on every sample)."""
        return self._data.get("realtime_k")

    @property
    def run_id(self) -> str:
        return run_id_of(self._data)

    @property
    def json(self) -> str:
        """Its canonical JSON (config_json)."""
        return canonical_json(self._data)


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not _RUN_ID_RE.match(run_id):
        raise ValueError(f"run_id: expected 16 lowercase hex characters, got {run_id!r}")
    return run_id


def extra_hparam_type(name: str, value: Any) -> pa.DataType:
    """Column type of an hparam no registered card declares, from its value (lists/dicts stored as JSON text)."""
    if isinstance(value, bool):
        return pa.bool_()
    if isinstance(value, int):
        return pa.int64()
    if isinstance(value, float):
        return pa.float64()
    return pa.string()


def run_table_schema(hparams: Mapping[str, Any]) -> pa.Schema:
    """Runs-table schema for one run: the fixed and registered columns, then its hparams no card declares."""
    columns = run_columns()
    known = {c.name for c in columns}
    fields = [pa.field(c.name, c.arrow) for c in columns]
    fields += [pa.field(k, extra_hparam_type(k, v)) for k, v in hparams.items() if k not in known]
    return pa.schema(fields)


# ----------------------------------------------------------------------------------------------- paths
def resolve_results_dir(results_dir: str | Path | None) -> Path:
    """The results dir as an absolute path (Ray Tune changes each trial's working directory)."""
    return Path(results_dir if results_dir is not None else DEFAULT_RESULTS_DIR).expanduser().absolute()


def partition_value(value: Any) -> str:
    """Percent-encode a partition value; DuckDB's hive partitioning decodes it back."""
    text = str(value)
    if not text:
        raise ValueError("partition value: expected a non-empty string")
    return quote(text, safe="")


def samples_root(results_dir: Path) -> Path:
    return Path(results_dir) / "samples"


def runs_root(results_dir: Path) -> Path:
    return Path(results_dir) / "runs"


def artifacts_root(results_dir: Path) -> Path:
    return Path(results_dir) / "artifacts"


def run_samples_dir(results_dir: Path, config: Mapping[str, Any], run_id: str) -> Path:
    parts = [f"{k}={partition_value(config[k])}" for k in PARTITION_KEYS[:-1]]
    return samples_root(results_dir).joinpath(*parts, f"run_id={check_run_id(run_id)}")


def run_file(results_dir: Path, sweep: str, run_id: str) -> Path:
    return runs_root(results_dir) / f"sweep={partition_value(sweep)}" / f"run_id={check_run_id(run_id)}.parquet"


def state_file(results_dir: Path, run_id: str) -> Path:
    return artifacts_root(results_dir) / check_run_id(run_id) / "state.npz"


def sweeps_root(results_dir: str | Path) -> Path:
    """<results>/sweeps: each sweep's record (<name>.json) and its driver's lock."""
    return Path(results_dir) / "sweeps"


def catalog_root(results_dir: Path) -> Path:
    return Path(results_dir) / "catalog"


def manifest_file(results_dir: Path) -> Path:
    return catalog_root(results_dir) / "manifest.json"


SEGMENT_KINDS = ("samples", "runs", "metrics")


def segment_file(results_dir: Path, segment_id: str, kind: str) -> Path:
    if kind not in SEGMENT_KINDS:
        raise ValueError(f"segment file kind: expected one of {SEGMENT_KINDS}, got {kind!r}")
    return catalog_root(results_dir) / "segments" / f"{segment_id}.{kind}.parquet"


# A segment's rows carry what the live layout keeps in folder names, and the run's stream and order, so that a
# query over packed rows needs no join.
SEGMENT_RUN_COLUMNS: tuple[Column, ...] = (
    *(next(c for c in IDENTITY_COLUMNS if c.name == k) for k in PARTITION_KEYS[:-1]),
    *(next(c for c in IDENTITY_COLUMNS if c.name == k) for k in ("stream", "order_index")),
)
SEGMENT_SAMPLE_ARROW_SCHEMA = pa.schema(list(SAMPLE_ARROW_SCHEMA) + [pa.field(c.name, c.arrow) for c in SEGMENT_RUN_COLUMNS])


# Globs relative to the results dir, matching the layout's depth exactly.
SAMPLES_GLOB = "samples/*/*/*/*/*/part-*.parquet"
RUNS_GLOB = "runs/*/run_id=*.parquet"
_PART_RE = re.compile(r"^part-(\d{9})\.parquet$")
TEMP_SUFFIX = ".tmp"


def part_name(start: int) -> str:
    return f"part-{start:09d}.parquet"


def part_start(name: str) -> int | None:
    """Stream position a part file starts at, or None when the name is not a part's."""
    m = _PART_RE.match(name)
    return int(m.group(1)) if m else None


def temp_name(final_name: str, token: str) -> str:
    """Hidden and not ending in .parquet, so no glob ever picks up a file still being written."""
    return f".{final_name}.{token}{TEMP_SUFFIX}"


def is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)
