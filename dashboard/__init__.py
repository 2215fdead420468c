"""Streamlit dashboard over the sweep results (`bca dashboard`).

Shipped as a package next to `orchestrator` so that the app file can be found from an installed
copy (`pip install -e .` or a wheel) and not only from a checkout.
"""

from pathlib import Path

APP_PATH = Path(__file__).resolve().parent / "app.py"

# The launcher hands the results directory to the app through this variable: Streamlit owns the
# app's argv, and an environment variable also works under streamlit.testing's AppTest.
RESULTS_ENV = "BCA_RESULTS_DIR"
