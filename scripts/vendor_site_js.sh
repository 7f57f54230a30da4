#!/usr/bin/env bash
# Refresh the JavaScript the static site serves from its own folder (scripts/site/vendor/),
# so `make site` and the pages it builds never touch the network.
#
# Only the widget manager is vendored: @jupyter-widgets/html-manager's dist/embed.js draws the
# stored widget views from the state nbconvert embeds in each page. It bundles the built-in
# controls and output widgets and needs no require.js. No installed Python package ships it
# (widgetsnbextension and jupyterlab_widgets carry bundles that only run inside a notebook
# server), so it comes from the npm registry, by `npm pack`, when this script is run by hand.
# The lessons use no TeX math and no Mermaid diagrams, so neither MathJax nor Mermaid is
# vendored: scripts/build_site.py refuses a page that would need them.
#
# Usage: scripts/vendor_site_js.sh [VERSION]   (default: the version in VENDOR.json)
# Writes embed.js, its bundled-licence notes and VENDOR.json (version, tarball integrity,
# sha256 of embed.js); build_site.py checks that sha256 before copying the file.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=scripts/site/vendor/html-manager
py=${PYTHON:-.venv/bin/python}
[ -x "$py" ] || py=python3
version=${1:-$("$py" -c "import json; print(json.load(open('$dest/VENDOR.json'))['version'])")}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "@jupyter-widgets/html-manager@$version" >/dev/null)
tarball=$(ls "$work"/*.tgz)
integrity=$(npm view "@jupyter-widgets/html-manager@$version" dist.integrity)
tar -xzf "$tarball" -C "$work" package/dist/embed.js package/dist/embed.js.LICENSE.txt
mkdir -p "$dest"
cp "$work/package/dist/embed.js" "$work/package/dist/embed.js.LICENSE.txt" "$dest/"
"$py" - "$dest" "$version" "$integrity" <<'PY'
import hashlib, json, sys
from pathlib import Path
dest, version, integrity = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
data = (dest / "embed.js").read_bytes()
(dest / "VENDOR.json").write_text(json.dumps({
    "package": "@jupyter-widgets/html-manager",
    "version": version,
    "licence": "BSD-3-Clause (LICENSE beside this file; bundled libraries: embed.js.LICENSE.txt)",
    "tarball_integrity": integrity,
    "files": {"embed.js": hashlib.sha256(data).hexdigest()},
}, indent=1) + "\n")
print(f"vendored @jupyter-widgets/html-manager@{version}: embed.js {len(data) / 1e6:.1f} MB")
PY
