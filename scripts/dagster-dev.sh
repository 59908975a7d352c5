#!/usr/bin/env bash
# `make dagster`: the Dagster UI, daemon and sensors on the pipelines of $KRISHIV_SPEC (default: this repository's
# krishiv.toml), with the instance of this repository's dagster.yaml (DAGSTER_HOME is the repository root). Dagster
# starts in the spec's folder, so its state (runs, event logs, compute logs, sensor cursors: state/dagster/) stays
# beside the project. Ctrl-C (or SIGTERM) stops it; see docs/dagster.md.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
spec="${KRISHIV_SPEC:-$repo/krishiv.toml}"
if [ ! -f "$spec" ]; then
  echo "make dagster: no spec file at $spec: set KRISHIV_SPEC to your krishiv.toml" >&2
  exit 2
fi
folder="$(cd "$(dirname "$spec")" && pwd)"
export KRISHIV_SPEC="$folder/$(basename "$spec")"  # absolute: every Dagster process reads it
export DAGSTER_HOME="$repo"
cd "$folder"
# With SIGINT and SIGTERM at their defaults, so that Ctrl-C and SIGTERM stop it however it was started (a background
# job of a script starts with SIGINT ignored: scripts/default_signals.py says why).
exec "$repo/.venv/bin/python" "$repo/scripts/default_signals.py" "$repo/.venv/bin/dagster" dev -w "$repo/workspace.yaml" -h "${DAGSTER_HOST:-127.0.0.1}" -p "${DAGSTER_PORT:-3000}"
