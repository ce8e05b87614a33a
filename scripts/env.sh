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

# (Re)build .venv-tools (the MCP client and jsonschema the tests use; benchmark peers)
# when it is missing or its requirements changed. Never mixed into .venv: user code
# imports from that one.
ensure_tools_venv() {
    local stamp=".venv-tools/.snakecage-requirements"
    local want
    want="$(sha256sum python/requirements-tools.txt | cut -d' ' -f1)"
    if [[ -x .venv-tools/bin/python && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return
    fi
    echo "snakecage: preparing .venv-tools with $BASE_PYTHON" >&2
    "$BASE_PYTHON" -m venv .venv-tools
    .venv-tools/bin/python -m pip install --quiet --disable-pip-version-check -r python/requirements-tools.txt
    echo "$want" > "$stamp"
}

# Debian packages the tests use: promtool (package prometheus) checks `/metrics`, chromium
# drives the status page. Installed only when missing, so a warm machine pays nothing.
ensure_apt_packages() {
    local missing=()
    command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
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
