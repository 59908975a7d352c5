#!/usr/bin/env bash
# Create the project-local virtualenv (.venv) and install Krishiv with its test tools. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v java >/dev/null 2>&1 && [ -z "${JAVA_HOME:-}" ]; then
  echo "Krishiv runs Spark, which needs Java 17 or newer; none was found." >&2
  echo "Install it (Debian/Ubuntu: apt-get install -y openjdk-17-jre-headless) and run this again." >&2
  exit 1
fi
PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "Krishiv needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version 2>&1)." >&2
  exit 1
fi
stamp=.venv/.krishiv-installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ]; then
  exit 0
fi
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check uv
.venv/bin/uv pip install --quiet --python .venv/bin/python -e '.[dev,bench]'
touch "$stamp"
echo "Krishiv is installed in .venv"
