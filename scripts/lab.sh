#!/usr/bin/env bash
# Start JupyterLab on the curriculum: bound to localhost, token authentication always on.
# Extra arguments are passed to `jupyter lab` (the tests add --no-browser and a port).
set -eu
cd "$(dirname "$0")/.."
args=(--ServerApp.ip=127.0.0.1 --ServerApp.root_dir=notebooks)
# Jupyter refuses to run as root without this flag; ordinary users never get it.
[ "$(id -u)" = "0" ] && args+=(--allow-root)
# Never an open server: a token is required (Jupyter generates a random one and prints the
# URL with it) unless the caller passes one of its own through JUPYTER_TOKEN.
exec .venv/bin/jupyter lab "${args[@]}" "$@"
