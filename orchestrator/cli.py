"""The `bca` command line: one typer app, one subcommand per job."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(
    name="bca",
    help="Online test-time adaptation of CLIP (BCA and baselines): sweeps, feature cache, results, dashboard.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

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

    typer.echo(f"dashboard for {results.resolve()} at http://{host}:{port}")
    launch(results, host=host, port=port)


@app.command("sweep")
def sweep_cmd(
    spec: Path = typer.Argument(..., help="Sweep spec YAML (e.g. experiments/demo.yaml)."),
    resume: bool = typer.Option(False, "--resume", help="Continue a sweep started before: finished runs are "
                                "skipped, unfinished ones go on from their last complete part."),
    address: str = typer.Option(None, "--address", help="Ray cluster to join (default: RAY_ADDRESS, else a "
                                "local Ray using this machine's cores)."),
) -> None:
    """Run a sweep spec on Ray Tune: one trial per online run, per-sample rows as Parquet under results_dir."""
    from orchestrator.sweep.command import sweep_command

    raise typer.Exit(sweep_command(spec, resume=resume, address=address))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
