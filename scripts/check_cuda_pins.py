"""Check that constraints.txt pins every wheel `make setup` installs for the CUDA extras.

For each of cuda12 and cuda13 this asks pip to resolve ``inference-lab[FLAVOUR]``'s jax extra,
``jax[FLAVOUR]==<the pinned jax>``, for Linux x86_64 and CPython 3.12 against the package
registry, under ``-c constraints.txt``, without installing anything (``pip install --dry-run
--report``, wheels only, for the manylinux tags of a glibc 2.35 machine). It then compares the
resolved set with constraints.txt: every wheel must be pinned, at the version pip chose.

Run it on any machine that reaches the registry (no GPU and no CUDA needed), after changing
the jax pin or before a workshop:

    .venv/bin/python scripts/check_cuda_pins.py            # exit 1 and a list if a pin is missing
    .venv/bin/python scripts/check_cuda_pins.py --unpinned # resolve without the CUDA pins and
                                                           # print the lines to paste
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "constraints.txt"
FLAVOURS = ("cuda12", "cuda13")
# A glibc 2.35 x86_64 machine (Ubuntu 22.04) accepts every manylinux tag up to 2_35.
PLATFORMS = ([f"manylinux_2_{minor}_x86_64" for minor in range(5, 36)]
             + ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"])


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[canonical(name)] = version.strip()
    return out


def resolve(flavour: str, jax_version: str, constraints: Path | None) -> dict[str, str]:
    """{name: version} pip would install for jax[flavour] on Linux x86_64, CPython 3.12."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
               "--disable-pip-version-check", "--only-binary=:all:", "--target", str(Path(tmp) / "t"),
               "--python-version", "3.12", "--implementation", "cp",
               "--abi", "cp312", "--abi", "abi3", "--abi", "none", "--report", str(report)]
        for tag in PLATFORMS:
            cmd += ["--platform", tag]
        if constraints is not None:
            cmd += ["-c", str(constraints)]
        cmd.append(f"jax[{flavour}]=={jax_version}")
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if not line.startswith("WARNING")]
            raise SystemExit(f"pip could not resolve jax[{flavour}]:\n" + "\n".join(errors[-10:]))
        data = json.loads(report.read_text())
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"] for i in data["install"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--unpinned", action="store_true",
                        help="resolve without constraints.txt and print the pins it would need")
    args = parser.parse_args(argv)
    pinned = pins(CONSTRAINTS.read_text())
    jax_version = pinned["jax"]
    bad = 0
    for flavour in FLAVOURS:
        resolved = resolve(flavour, jax_version, None if args.unpinned else CONSTRAINTS)
        print(f"jax[{flavour}]=={jax_version}: {len(resolved)} wheels")
        for name, version in sorted(resolved.items()):
            if pinned.get(name) != version:
                bad += 1
                have = f"pinned {pinned[name]}" if name in pinned else "not pinned"
                print(f"  {name}=={version}   ({have})")
    if bad:
        print(f"{bad} wheel(s) differ from constraints.txt" + ("" if args.unpinned else ": fix the lines above"))
        return 1
    print("constraints.txt pins every wheel of both CUDA extras")
    return 0


if __name__ == "__main__":
    sys.exit(main())
