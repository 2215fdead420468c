"""The `bca` command line: one typer app, one subcommand per job."""

from __future__ import annotations

import importlib.metadata
import os
import socket
from pathlib import Path

import typer
from typer.core import TyperOption

from orchestrator.registry.views import DATASET_PROTOCOL

_value_type = TyperOption.display_type_rich


def _flag_type(self: TyperOption, ctx) -> str | None:
    """The help's type column: nothing for a flag (typer writes '<bool>', as if the flag took a value)."""
    return None if self.is_flag else _value_type(self, ctx)


TyperOption.display_type_rich = _flag_type

app = typer.Typer(
    name="bca",
    help="Online test-time adaptation of CLIP (BCA and baselines): sweeps, feature cache, results, dashboard.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bca {importlib.metadata.version('bca-orchestrator')}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Online test-time adaptation of CLIP (BCA and baselines): sweeps, feature cache, results, dashboard."""

# Results subcommands (query, report, verify) live with the results package.
from orchestrator.results.cli import register as _register_results  # noqa: E402

_register_results(app)


@app.command("dashboard")
def dashboard_cmd(
    results: Path = typer.Option(Path("results"), "--results", help="Results directory written by `bca sweep`."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on; loopback only unless you set another."),
    port: int = typer.Option(8501, "--port", min=1, max=65535, help="TCP port to listen on."),
) -> None:
    """Open the Streamlit dashboard over a results directory (listens on 127.0.0.1 by default)."""
    from dashboard.launch import launch

    problem = _port_taken(host, port)
    if problem:
        typer.echo(f"error: --port {port}: {problem}; expected a free port (e.g. --port {port + 1})", err=True)
        raise typer.Exit(2)
    typer.echo(f"dashboard for {results.resolve()} at http://{host}:{port}")
    launch(results, host=host, port=port)


def _port_taken(host: str, port: int) -> str | None:
    """Why the dashboard could not listen on host:port (checked by binding it briefly), or None."""
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.bind((host, port))
    except OSError as exc:
        return f"cannot listen on {host}:{port} ({exc.strerror or exc}: another program may be using it)"
    return None


@app.command("sweep")
def sweep_cmd(
    spec: Path = typer.Argument(..., help="Sweep spec YAML (e.g. experiments/demo.yaml)."),
    resume: bool = typer.Option(False, "--resume", help="Continue a sweep started before: finished runs are "
                                "skipped, unfinished ones go on from their last complete part."),
    address: str = typer.Option(None, "--address", help="Ray cluster to join, host:port as `ray start --head` "
                                "printed (default: RAY_ADDRESS, else a local Ray of the sweep's own using this "
                                "machine's cores, also where a `ray start` cluster runs here). Its nodes must "
                                "share results_dir and cache_dir at the same absolute path."),
    ray_dashboard: bool = typer.Option(False, "--ray-dashboard", help="Start Ray's own dashboard with the local "
                                       "Ray (on 127.0.0.1, while the sweep runs) and print its address; with "
                                       "--address, print the cluster's."),
    progress_every: float = typer.Option(30.0, "--progress-every", min=0, help="Seconds between the progress "
                                         "lines of a trial still running (encoding, adapting); 0: every part."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan (runs and trials per backbone, dataset "
                                 "and method, feature-cache entries to encode, estimated cost); run nothing."),
    yes: bool = typer.Option(False, "--yes", help="Start a sweep of more than 5,000 runs to run."),
    rerun_changed: bool = typer.Option(False, "--rerun-changed", help="Run again the finished runs made on "
                                       "another version of their dataset's image list."),
) -> None:
    """Run a sweep spec on Ray Tune: one trial per online run, per-sample rows as Parquet under results_dir."""
    if address:
        os.environ["RAY_ADDRESS"] = address  # before Ray is imported: it decides which address Ray binds
    from orchestrator.sweep.command import sweep_command

    raise typer.Exit(sweep_command(spec, resume=resume, address=address, ray_dashboard=ray_dashboard,
                                   progress_every_s=progress_every, dry_run=dry_run, yes=yes,
                                   rerun_changed=rerun_changed))


@app.command("compare")
def compare_cmd(
    method: str = typer.Argument(..., help="A registered method name, or a plugin module that registers one."),
    results: Path = typer.Option(Path("results"), "--results", help="Results directory (the suite is a sweep "
                                 "named compare-METHOD there: run again, it resumes; with more --orders, it grows)."),
    orders: int = typer.Option(3, "--orders", min=1, help="Independent stream orders per configuration."),
    samples: int = typer.Option(1000, "--samples", min=100, help="Samples per synthetic stream."),
    data_root: Path = typer.Option(None, "--data-root", help="Compare on your datasets (with --dataset) instead "
                                   "of the synthetic presets."),
    dataset: list[str] = typer.Option(None, "--dataset", help="Dataset under --data-root (repeatable)."),
    cache_dir: Path = typer.Option(None, "--cache-dir", help="Feature cache folder for real datasets."),
    backbone: str = typer.Option("ViT-B-16", "--backbone", help="open_clip model for real datasets."),
    pretrained: str = typer.Option("openai", "--pretrained", help="Its pretrained tag."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the suite's plan; run nothing."),
    resume: bool = typer.Option(True, "--resume", hidden=True, help="Always on: a compare goes on from the runs "
                                "it finished (the hint an interrupted sweep prints names this flag)."),
) -> None:
    """Run METHOD and every built-in method on a standard suite and print a leaderboard: gain over CLIP with its
    interval, worst 10%, ECE, samples/s, and which differences to the best are significant."""
    from orchestrator.compare import compare_command

    raise typer.Exit(compare_command(method, results_dir=results, orders=orders, samples=samples,
                                     data_root=data_root, datasets=dataset or [], cache_dir=cache_dir,
                                     backbone=backbone, pretrained=pretrained, dry_run=dry_run))


@app.command("cache")
def cache_cmd(
    spec: Path = typer.Argument(None, help="Sweep spec YAML: pre-encode every real (backbone, dataset, views, "
                                "seed) it uses. Or leave it out and give the explicit options below."),
    model: str = typer.Option(None, "--model", help="open_clip model name, e.g. ViT-B-16."),
    pretrained: str = typer.Option(None, "--pretrained", help="Tag (e.g. openai) or a checkpoint file; "
                                   "leave out for random weights."),
    dataset: list[str] = typer.Option(None, "--dataset", help="Dataset name (repeatable), e.g. imagenet-a."),
    data_root: Path = typer.Option(None, "--data-root", help="Folder holding the datasets (docs/real-data.md)."),
    cache_dir: Path = typer.Option(None, "--cache-dir", help="Feature cache folder."),
    views: str = typer.Option(DATASET_PROTOCOL, "--views", help="dataset (each dataset's own protocol: augmix "
                              "for ImageNet-A/-V2/-R/-Sketch, single otherwise) | single | augmix | augmixN | crops "
                              "| cropsN. For what a sweep's methods need, give the spec instead."),
    seed: list[int] = typer.Option([1], "--seed", help="AugMix seed (repeatable); ignored for single views."),
    templates: list[str] = typer.Option(["dataset"], "--templates", help="Template set whose text embeddings "
                                        "to cache too (repeatable)."),
    quick_gelu: bool = typer.Option(None, "--quick-gelu/--no-quick-gelu", help="Override the activation "
                                    "(default: from the tag; QuickGELU for OpenAI TorchScript files)."),
    workers: int = typer.Option(None, "--workers", min=0, help="DataLoader workers (default min(8, cores))."),
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Views per encoder call."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda | cuda:N."),
    corrupt: str = typer.Option("skip", "--corrupt", help="skip (record unreadable images) | error."),
    force: bool = typer.Option(False, "--force", help="Re-encode entries that exist."),
    weights_dir: str = typer.Option(None, "--weights-dir", help="Where tag weights are cached "
                                    "(default: the Hugging Face cache and ~/.cache/clip)."),
    allow_download: bool = typer.Option(False, "--allow-download", help="Fetch tag weights that are not "
                                        "cached (needs network)."),
) -> None:
    """Pre-encode image features (and text embeddings) into the feature cache; a re-run is a no-op."""
    from orchestrator.features.command import jobs_from_args, run_jobs

    if spec is not None:
        if model or dataset or data_root or cache_dir:
            raise typer.BadParameter("give a spec or --model/--dataset/--data-root/--cache-dir, not both")
        from orchestrator.sweep.encode import jobs_from_spec
        from orchestrator.sweep.load import SpecError

        try:
            jobs = jobs_from_spec(spec)
        except SpecError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    else:
        missing = [flag for flag, value in (("--model", model), ("--dataset", dataset), ("--data-root", data_root),
                                            ("--cache-dir", cache_dir)) if not value]
        if missing:
            raise typer.BadParameter(f"without a spec, give {', '.join(missing)}")
        try:
            jobs = jobs_from_args(model, pretrained, dataset, data_root, cache_dir, views, seed, templates, quick_gelu)
        except ValueError as exc:  # an unknown dataset or views value, named in the message
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    raise typer.Exit(run_jobs(jobs, device=device, batch_size=batch_size, num_workers=workers, corrupt=corrupt,
                              force=force, weights_dir=weights_dir, allow_download=allow_download,
                              echo=typer.echo))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
