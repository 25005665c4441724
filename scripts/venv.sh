# Sourced by the scripts: create or reuse the project virtualenv and install valetkey into it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VALETKEY_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "creating virtualenv $VENV" >&2
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.valetkey-installed"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    echo "installing valetkey and its test tools into $VENV (log: $VENV/install.log)" >&2
    if ! { "$VENV/bin/python" -m pip install --upgrade pip \
           && "$VENV/bin/python" -m pip install -e "$ROOT[dev]"; } >"$VENV/install.log" 2>&1; then
        tail -n 40 "$VENV/install.log" >&2
        echo "error: installing valetkey failed (full log: $VENV/install.log)" >&2
        exit 1
    fi
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
