#!/usr/bin/env bash
# A headless Chromium for the report's browser test (tests/test_report_browser.py). Idempotent: nothing is
# done when one is on PATH. As root on Debian/Ubuntu it installs `chromium-headless-shell` with apt-get;
# otherwise it says what to install and leaves the decision to the user (the test then fails in CI, where
# RAYSWEEP_REQUIRE_VLLM is set, and is skipped elsewhere).
set -euo pipefail

for name in chromium-headless-shell chromium chromium-browser google-chrome; do
    if path=$(command -v "$name"); then
        echo "install-browser: headless browser present: $path"
        exit 0
    fi
done

if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
    echo "install-browser: installing chromium-headless-shell with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    if ! apt-get install -y -qq --no-install-recommends chromium-headless-shell; then
        apt-get install -y -qq --no-install-recommends chromium  # older releases: the full browser
    fi
    exit 0
fi

cat >&2 <<'MSG'
install-browser: no headless Chromium on PATH, and this script installs one only as root with apt-get.
  Debian/Ubuntu: sudo apt-get install chromium-headless-shell   (or: chromium)
  elsewhere: any Chromium or Chrome on PATH as chromium, chromium-browser or google-chrome
The report's browser test (tests/test_report_browser.py) is skipped without one, and fails when
RAYSWEEP_REQUIRE_VLLM=1 (as `make test` and CI set it).
MSG
