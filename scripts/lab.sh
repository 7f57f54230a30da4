#!/usr/bin/env bash
# Start JupyterLab on the learner's copy of the curriculum (scripts/learner_copy.py: my-notebooks/,
# or $INFERENCE_LAB_NOTEBOOKS), so autosave never rewrites the tracked notebooks: bound to
# localhost, token authentication always on. Extra arguments are passed to `jupyter lab` (the
# tests add --no-browser and a port).
set -eu
cd "$(dirname "$0")/.."
work="${INFERENCE_LAB_NOTEBOOKS:-my-notebooks}"
args=(--ServerApp.ip=127.0.0.1 "--ServerApp.root_dir=$work")
# As root, JupyterLab's terminals hand whoever holds the token a root shell. Jupyter itself
# refuses to run as root without --allow-root; so does this script, unless the user opts in.
if [ "$(id -u)" = "0" ]; then
  if [ "${ALLOW_ROOT:-}" != "1" ]; then
    echo "lab.sh: refusing to start JupyterLab as root (its terminals would give anyone with the token a root shell); run it as an ordinary user, or opt in with ALLOW_ROOT=1 make lab" >&2
    exit 1
  fi
  args+=(--allow-root)
fi
# Never an open server: the token is passed explicitly on the command line, which wins over any
# config file (a learner's own jupyter_server_config with an empty token would otherwise serve
# without authentication): JUPYTER_TOKEN if set and not empty, else a fresh random one. Jupyter
# prints the URL with it.
token="${JUPYTER_TOKEN:-}"
if [ -z "$token" ]; then
  token=$(.venv/bin/python -c 'import secrets; print(secrets.token_urlsafe(32))')
fi
args+=("--IdentityProvider.token=$token")
INFERENCE_LAB_NOTEBOOKS="$work" .venv/bin/python scripts/learner_copy.py
exec .venv/bin/jupyter lab "${args[@]}" "$@"
