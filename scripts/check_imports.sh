#!/usr/bin/env bash
# The architecture checks: import-linter's contracts (pyproject.toml) and no import cycle between
# the project's modules, both run against a fresh installed copy (the layout users get, where the
# repository's launchers/ and models/ are tflaunch.launchers and tflaunch.models); then, on the
# checkout, no reach into another module's private names, the trace hook on the standard library
# only, no backend name compared outside its folder, no class over 250 lines
# and no module of the project's code (not tests/) over 600.
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(mktemp -d)
trap 'rm -rf "$target"' EXIT
python3 -m pip install -q --no-deps --no-build-isolation --target "$target" . 2>&1 | grep -v '^WARNING' || true
rm -rf build
root=$PWD
# From the installed copy: lint-imports puts the working directory on the path first.
(cd "$target" && PYTHONPATH="$target" lint-imports --no-cache "$root/pyproject.toml")
(cd "$target" && PYTHONPATH="$target" python3 "$root/scripts/import_cycles.py" tflaunch)
python3 scripts/private_names.py
python3 scripts/hook_imports.py
python3 scripts/backend_names.py
python3 scripts/class_sizes.py
