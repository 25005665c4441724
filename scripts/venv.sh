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
    echo "installing valetkey and its test tools into $VENV (first time: about 2 minutes; log: $VENV/install.log)" >&2
    # progress: one line per package pip fetches, the full output goes to the log
    if ! { "$VENV/bin/python" -m pip install --upgrade pip \
           && "$VENV/bin/python" -m pip install --progress-bar off -e "$ROOT[dev]"; } 2>&1 \
         | tee "$VENV/install.log" \
         | { grep --line-buffered -E '^(Collecting|Processing|Building|Installing collected|Successfully installed)' || true; } \
         | sed -u -e 's/^Collecting /  fetching /' -e 's#^Processing .*/#  fetching #' -e 's/^Successfully installed .*/  installed/' \
               -e 's/^Installing collected packages.*/  installing the packages …/' >&2; then
        tail -n 40 "$VENV/install.log" >&2
        echo "error: installing valetkey failed (full log: $VENV/install.log)" >&2
        exit 1
    fi
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
