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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
