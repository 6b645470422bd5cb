#!/usr/bin/env bash
# The README's run command: installs what is missing (safe to run twice), then brings up the
# Procfile stack on the embedded CPU default with honcho.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
bash scripts/setup.sh
exec .venv/bin/honcho start "$@"
