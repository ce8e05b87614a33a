# Sourced by the other scripts: finds CPython 3.11 by absolute path (never a shim) and
# makes sure ./.venv holds the pinned packages. Idempotent and quick when nothing changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

find_python() {
    if [[ -n "${SNAKECAGE_PYTHON:-}" ]]; then echo "$SNAKECAGE_PYTHON"; return; fi
    if command -v pyenv >/dev/null 2>&1; then
        local prefix
        if prefix="$(pyenv prefix 3.11.7 2>/dev/null)" && [[ -x "$prefix/bin/python3.11" ]]; then
            echo "$prefix/bin/python3.11"; return
        fi
    fi
    for candidate in /usr/local/bin/python3.11 /usr/bin/python3.11; do
        if [[ -x "$candidate" ]]; then echo "$candidate"; return; fi
    done
    echo "snakecage: no CPython 3.11 found; set SNAKECAGE_PYTHON to its absolute path" >&2
    exit 1
}

BASE_PYTHON="$(find_python)"
export PYO3_PYTHON="$BASE_PYTHON"

# (Re)build the venv when it is missing or the requirement files changed.
ensure_venv() {
    local stamp=".venv/.snakecage-requirements"
    local want
    want="$(cat python/requirements.txt python/requirements-dev.txt | sha256sum | cut -d' ' -f1)"
    if [[ -x .venv/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return
    fi
    echo "snakecage: preparing .venv with $BASE_PYTHON" >&2
    "$BASE_PYTHON" -m venv .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check \
        -r python/requirements.txt -r python/requirements-dev.txt
    echo "$want" > "$stamp"
}

# (Re)build .venv-bench, the benchmark tools (Jupyter, pydantic-monty, matplotlib for the
# plot), when it is missing or python/requirements-bench.txt changed. Kept apart from .venv
# so nothing a benchmark needs becomes importable by user code.
ensure_bench_venv() {
    local stamp=".venv-bench/.snakecage-requirements"
    local want
    want="$(sha256sum python/requirements-bench.txt | cut -d' ' -f1)"
    if [[ -x .venv-bench/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return
    fi
    echo "snakecage: preparing .venv-bench with $BASE_PYTHON" >&2
    "$BASE_PYTHON" -m venv .venv-bench
    .venv-bench/bin/python -m pip install --quiet --disable-pip-version-check \
        -r python/requirements-bench.txt
    echo "$want" > "$stamp"
}
