#!/usr/bin/env bash
# Write constraints.txt anew: every package, transitive ones included, at the version that a fresh
# install of the dev extra resolves to today. scripts/test.sh installs against it, so a run is
# reproducible; scripts/test.sh --latest ignores it, so newer releases are tried by us first. Run
# this after changing a dependency in pyproject.toml, or to take newer releases once
# `scripts/test.sh --latest` passes with them.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=$(mktemp -d)
trap 'rm -rf "$venv"' EXIT
"${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q -e '.[dev]'
{
  echo "# Written by scripts/lock.sh from a fresh install of '.[dev]' ($("$venv/bin/python" -c \
    'import platform; print("Python", platform.python_version(), platform.system(), platform.machine())'))."
  echo "# scripts/test.sh installs against these versions; scripts/test.sh --latest ignores them."
  # --all keeps setuptools (the dev extra needs >=68); pip itself is the venv's own.
  "$venv/bin/python" -m pip freeze --all --exclude-editable | grep -v '^pip=='
} >constraints.txt
echo "constraints.txt: $(grep -vc '^#' constraints.txt) packages"
