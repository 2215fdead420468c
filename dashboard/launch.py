"""Start the Streamlit server for the dashboard: `bca dashboard` lands here."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from dashboard import APP_PATH, RESULTS_ENV

LOOPBACK = "127.0.0.1"


def streamlit_command(host: str, port: int) -> list[str]:
    """argv for `python -m streamlit run` serving the app on host:port.

    Headless so it never tries to open a browser, no usage statistics (the machines may have no
    internet, and results stay local), no file watcher (the results dir is read through DuckDB,
    not watched; re-running on source edits is a development feature), and the viewer's toolbar (no
    "Deploy" button for a local results browser).
    """
    return [
        sys.executable, "-m", "streamlit", "run", str(APP_PATH),
        "--server.address", host,
        "--server.port", str(port),
        "--server.headless", "true",
        "--server.fileWatcherType", "none",
        "--browser.gatherUsageStats", "false",
        "--global.developmentMode", "false",
        "--client.toolbarMode", "viewer",
    ]


def launch(results_dir: Path, host: str = LOOPBACK, port: int = 8501) -> None:
    """Replace this process with the Streamlit server, so that stopping `bca dashboard` stops it."""
    if not APP_PATH.is_file():
        raise FileNotFoundError(f"dashboard app not found at {APP_PATH}; reinstall the package (pip install -e .)")
    env = dict(os.environ)
    env[RESULTS_ENV] = str(Path(results_dir).expanduser().resolve())
    argv = streamlit_command(host, port)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)
