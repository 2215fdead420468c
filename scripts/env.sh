# Sourced by demo.sh and test.sh: create or reuse .venv and install the project into it.
# Reinstalls only when pyproject.toml changed since the last install (a stamp holds its hash).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$(command -v python3.11 || command -v python3)}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "error: Python 3.11 is required (found $("$PY" --version 2>&1) at $PY); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
STAMP=.venv/.bca-installed
WANT="$(sha256sum pyproject.toml | cut -c1-64)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$WANT" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  # torch is capped at 2.14.1 in pyproject.toml: pip takes it from local wheels where they exist.
  .venv/bin/python -m pip install --quiet -e '.[test]'
  echo "$WANT" > "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
