#!/usr/bin/env bash
# Print the path of a Python >= 3.12 that actually runs, or explain how to get one and exit 1.
# Order: $PYTHON (if set: used or rejected, never silently replaced), python3.12 / python3.13 /
# python3 on PATH, then pyenv-installed versions (the bare pyenv shims refuse to run unless
# PYENV_VERSION is set, so the interpreters are called by their full path).
set -u
MIN_MINOR=12

runs_and_new_enough() {  # $1: a command or path; prints its absolute path if it is >= 3.12
  "$1" -c "import sys; assert sys.version_info >= (3, $MIN_MINOR); print(sys.executable)" 2>/dev/null
}

if [ -n "${PYTHON:-}" ]; then
  if found=$(runs_and_new_enough "$PYTHON"); then echo "$found"; exit 0; fi
  version=$("$PYTHON" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null || echo "not runnable")
  echo "error: PYTHON=$PYTHON is Python $version; Inference Lab needs Python >= 3.$MIN_MINOR (JAX >= 0.11 does). Pass PYTHON=/path/to/python3.12, or install one (pyenv install 3.12, conda create -n py312 python=3.12, or your OS package)." >&2
  exit 1
fi

for candidate in python3.12 python3.13 python3.14 python3; do
  if command -v "$candidate" >/dev/null 2>&1 && found=$(runs_and_new_enough "$candidate"); then
    echo "$found"; exit 0
  fi
done

roots=()
command -v pyenv >/dev/null 2>&1 && roots+=("$(pyenv root 2>/dev/null)")
roots+=("${PYENV_ROOT:-$HOME/.pyenv}")
for root in "${roots[@]}"; do
  for candidate in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -V); do
    if [ -x "$candidate/bin/python3" ] && found=$(runs_and_new_enough "$candidate/bin/python3"); then
      echo "$found"; exit 0
    fi
  done
done

echo "error: no Python >= 3.$MIN_MINOR found (tried PYTHON, python3.12, python3.13, python3 on PATH and pyenv versions). Install one (pyenv install 3.12, conda create -n py312 python=3.12, or your OS package) and run 'make setup PYTHON=/path/to/python3.12'." >&2
exit 1
