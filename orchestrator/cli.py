"""The `bca` command line: one typer app, one subcommand per job."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="bca",
    help="Online test-time adaptation of CLIP (BCA and baselines): sweeps, feature cache, results, dashboard.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
