#!/usr/bin/env bash
# The Python contract tests' virtualenv: the real `e2b`, `e2b-code-interpreter` and `daytona`
# packages from PyPI and pytest, exactly as pinned in contract-tests/python/requirements.txt.
# Built once under a cache dir and reused while the pins and the interpreter stay the same, so a
# rerun costs a hash. Prints the virtualenv's directory on stdout (and nothing else there);
# progress goes to stderr. Called by scripts/install-system-deps.sh --with-postgres and again by
# the Python suite's runner (contract-tests/python/pytest.test.ts), which takes the path.
#
#   NESTBOX_PYTHON_SDKS_DIR  where the virtualenv lives (default: ~/.cache/nestbox/python-sdks)
#   NESTBOX_PYTHON           the interpreter to build it from (default: Debian's /usr/bin/python3,
#                            else python3 on PATH)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
requirements="$root/contract-tests/python/requirements.txt"
home="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
venv="${NESTBOX_PYTHON_SDKS_DIR:-${XDG_CACHE_HOME:-$home/.cache}/nestbox/python-sdks}"

python="${NESTBOX_PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import venv, ensurepip' 2>/dev/null; then python=/usr/bin/python3; else python=python3; fi
fi
if ! "$python" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
  echo "install-python-sdks: $python is not Python 3.9+ with venv (on Debian: scripts/install-system-deps.sh --with-postgres installs python3-venv)" >&2
  exit 1
fi

# The stamp names what the virtualenv was built from; anything else means build it again.
want="$(sha256sum "$requirements" | cut -d' ' -f1) $("$python" -c 'import sys; print(sys.version.split()[0], sys.executable)')"
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9 # two callers at once (a test run and an install) build it once
if [[ -f "$venv/.nestbox-stamp" && "$(cat "$venv/.nestbox-stamp")" == "$want" ]]; then
  echo "$venv"
  exit 0
fi

echo "install-python-sdks: building $venv from $requirements" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --no-input --disable-pip-version-check --require-virtualenv -r "$requirements" >&2
# Everything installed must be what the file pins: a package it forgot would come in unpinned.
"$venv/bin/python" - "$requirements" >&2 <<'EOF'
import re, sys
from importlib.metadata import distributions
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
pinned = {}
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line:
        name, version = line.split("==")
        pinned[norm(name)] = version
unpinned = sorted(f"{d.metadata['Name']}=={d.version}" for d in distributions()
                  if norm(d.metadata["Name"]) not in pinned and norm(d.metadata["Name"]) not in ("pip", "setuptools"))
if unpinned:
    sys.exit("install-python-sdks: installed but not pinned in requirements.txt: " + ", ".join(unpinned))
EOF
echo "$want" >"$venv/.nestbox-stamp"
echo "$venv"
