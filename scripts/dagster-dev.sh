#!/usr/bin/env bash
# `make dagster`: the Dagster UI, daemon and sensors on this repository's pipelines (krishiv.toml), with the
# instance of dagster.yaml (DAGSTER_HOME is the repository root; runs and logs go to state/dagster).
set -euo pipefail
cd "$(dirname "$0")/.."
export DAGSTER_HOME="$PWD"
exec .venv/bin/dagster dev -w workspace.yaml -h "${DAGSTER_HOST:-127.0.0.1}" -p "${DAGSTER_PORT:-3000}"
