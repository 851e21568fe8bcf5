#!/usr/bin/env bash
# `make sanity`: ansible-test sanity on a copy of this checkout laid out as
# <tmp>/ansible_collections/vllm_fleet/fleet (ansible-test needs that path; the repo's own
# collections/ link resolves back to the checkout, which is not under ansible_collections).
# Each test gets its own venv (--venv) with ansible-test's pinned requirements from the
# package index. Extra arguments go to ansible-test (e.g. --test pylint).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$REPO/.venv/bin/python"
PIP_VERSION=24.2  # ansible-test 2.19's bootstrap pip (python_requirements.py)

# ansible-test fetches get-pip-<ver>.py from a host outside the package index; a stand-in
# that installs pip from its PyPI wheel goes where ansible-test looks for a cached copy.
cache="$HOME/.ansible/test/cache"
standin="$cache/get_pip_${PIP_VERSION//./_}.py"
mkdir -p "$cache"
if ! ls "$cache"/pip-"$PIP_VERSION"-py3-none-any.whl >/dev/null 2>&1; then
    "$PY" -m pip download --quiet --no-deps --only-binary :all: -d "$cache" "pip==$PIP_VERSION"
fi
# (a real get-pip script cached on a machine that could download it is left alone)
if [[ ! -f $standin ]] || grep -q "Stand-in for ansible-test's pip bootstrap" "$standin"; then
    cp "$REPO/tests/sanity/get_pip.py" "$standin"
fi

work="${SANITY_DIR:-}"
if [[ -z $work ]]; then
    work="$(mktemp -d)"
    trap 'rm -rf "$work"' EXIT
fi
dest="$work/ansible_collections/vllm_fleet/fleet"
rm -rf "$dest"
mkdir -p "$dest"
# The collection as `ansible-galaxy collection build` ships it: tracked and new files less
# galaxy.yml's build_ignore (tests/, molecule/, ... are the project's own test code, linted
# by pytest and ansible-lint), plus tests/sanity/ for the ignore file.
(cd "$REPO" && git ls-files -co --exclude-standard -z | "$PY" -c '
import fnmatch, sys, yaml
ignore = yaml.safe_load(open("galaxy.yml"))["build_ignore"]
for path in sys.stdin.read().split("\0"):
    parts = path.split("/")
    shipped = not any(fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(parts[0], pat) for pat in ignore)
    if path and (shipped or path.startswith("tests/sanity/")):
        sys.stdout.write(path + "\0")
' | tar -cf - --null -T -) | tar -xf - -C "$dest"
echo "sanity: $dest"
cd "$dest"
"$REPO/.venv/bin/ansible-test" sanity --venv --python 3.11 --color no "$@"
