"""Install the lab's JupyterLab defaults into this environment (run by `make setup`).

JupyterLab reads package-owned defaults from ``<app dir>/settings/overrides.d/*.json`` (the app
dir is ``<environment>/share/jupyter/lab``), before the user's own settings, so this changes
the defaults of this environment only: nothing in the learner's home folder, and a learner who
sets the option in JupyterLab's settings editor still wins.

The one default set here: JupyterLab does not ask whether to fetch Jupyter news (the pop-up
would sit over the first lesson) and does not check for updates (the lab pins its versions).

Conda users run it once after `conda env create`: `python scripts/lab_settings.py`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

FILENAME = "inference-lab.json"
OVERRIDES = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}


def default_settings_dir() -> Path:
    """The app settings folder JupyterLab of this interpreter reads (``<app dir>/settings``)."""
    from jupyterlab.commands import get_app_dir

    return Path(get_app_dir()) / "settings"


def install(settings_dir: Path | None = None) -> Path:
    """Write ``overrides.d/inference-lab.json`` under ``settings_dir``; return its path."""
    settings_dir = default_settings_dir() if settings_dir is None else Path(settings_dir)
    path = settings_dir / "overrides.d" / FILENAME
    text = json.dumps(OVERRIDES, indent=1) + "\n"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings-dir", default=None,
                        help="JupyterLab's app settings folder (default: this environment's)")
    args = parser.parse_args(argv)
    path = install(args.settings_dir)
    print(f"JupyterLab defaults for the lab: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
