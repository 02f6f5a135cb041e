#!/usr/bin/env bash
# Install what the tests need, then run them: ruff, then pytest (all of it; pass -m "not slow"
# for the quick subset). As root on Debian it also installs the system packages the Slurm and
# SSH test hosts need (.ci/apt-packages.txt); elsewhere those tests skip with a reason.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  missing=()
  while read -r pkg; do
    [[ -z $pkg || $pkg == \#* ]] && continue
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done < .ci/apt-packages.txt
  if ((${#missing[@]})); then
    echo "installing Debian packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
fi

python3 -m pip install -q -e '.[dev]'
ruff check .
ruff format --check .
bash scripts/check_imports.sh
python3 -m pytest "$@"
