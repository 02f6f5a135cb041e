#!/usr/bin/env bash
# Run the checks and the tests in a virtual environment made anew on every run (.venv-test/), so a
# run proves what a fresh install gets, not what this machine happens to have installed. Only the
# pip cache carries over between runs.
#
#   scripts/test.sh [pytest arguments]           the locked versions (constraints.txt): reproducible
#   scripts/test.sh --latest [pytest arguments]  the newest releases pyproject.toml allows: drift
#
# It runs ruff, the architecture checks (scripts/check_imports.sh), the tests' clock-and-port
# check (scripts/check_test_clock.py) and pytest (all of it; pass
# -m "not slow" for the quick subset), each from that venv. As root on Debian it also installs the
# system packages the Slurm and SSH test hosts need (.ci/apt-packages.txt); elsewhere those tests
# skip with a reason. Set PYTHON to build the venv from another interpreter (default: python3).
set -euo pipefail
cd "$(dirname "$0")/.."

pins=(-c constraints.txt)
if [[ ${1:-} == --latest ]]; then
  pins=()
  shift
fi

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

# A venv without --system-site-packages sees neither the interpreter's packages nor the user's;
# PYTHONPATH and PYTHONHOME would let them back in, so they go too.
venv=.venv-test
rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
unset PYTHONPATH PYTHONHOME
# uv installs no bytecode, and the tests start a Python process per CLI call, agent and stand-in
# task: where PYTHONDONTWRITEBYTECODE is set, every one of them compiled what it imported.
# Unset, the first writes it and the rest read it (about 7 % of the quick subset's CPU here).
unset PYTHONDONTWRITEBYTECODE
export VIRTUAL_ENV=$PWD/$venv
export PATH=$VIRTUAL_ENV/bin:$PATH  # python3, ruff, lint-imports and tflaunch are the venv's
started=$SECONDS
# uv installs what pip would (the same constraints, the same resolution rules) in a fraction of
# the time: parallel downloads, and wheels linked from its cache instead of unpacked anew (the
# dev extra holds TensorFlow: about 90 s with pip here, 15 s with uv). pip installs uv itself
# (at the locked version), and is the fallback wherever uv cannot be had.
if ! { python3 -m pip install -q ${pins[@]+"${pins[@]}"} uv >/dev/null 2>&1 &&
  python3 -m uv pip install -q --python "$VIRTUAL_ENV/bin/python" ${pins[@]+"${pins[@]}"} -e '.[dev]'; }; then
  echo "uv could not install the dev extra; installing it with pip"
  python3 -m pip install -q ${pins[@]+"${pins[@]}"} -e '.[dev]'
fi
if ((${#pins[@]})); then
  echo "installed the locked versions (constraints.txt) in $((SECONDS - started)) s"
else
  echo "installed the newest releases in $((SECONDS - started)) s; not as in constraints.txt:"
  python3 -m pip freeze --all --exclude-editable | grep -v '^pip==' \
    | grep -vxFf <(grep -v '^#' constraints.txt) | sed 's/^/  /' || echo "  (none)"
fi

ruff check .
ruff format --check .
bash scripts/check_imports.sh
python3 scripts/check_test_clock.py  # no verdict from the wall clock, no literal port in tests/
# Three workers (TEST_WORKERS; 0 runs in this process), each with a set of SSH test hosts of its
# own: the Slurm cluster's tests stay on one worker (tests/conftest.py groups them), the rest
# spread. Three on two cores because the suite waits as much as it computes (the host tests on
# daemons, timers and remote tasks): on the 2-core machine a clean-clone run took 12.1 minutes
# in all on three workers (13 % of the CPU idle) and on four (6 % idle). The quick subset
# (-m "not slow") waits on the launcher's timeouts and idle heuristics more than it computes: six
# workers (quiet, 29 November: 110 s in all on six, 121 s on four).
workers=3
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  if [[ ${args[i]} == -m && ${args[i + 1]:-} == "not slow" || ${args[i]} == "-mnot slow" ]]; then
    workers=6
  fi
done
# Each test's wall and CPU seconds go to .test-costs/ (tests/costs.py); the most expensive
# modules are printed after the run, passed or not (tests/README.md keeps the table).
rm -rf .test-costs
status=0
python3 -m pytest -p tests.costs --costs .test-costs -n "${TEST_WORKERS:-$workers}" --dist loadgroup "$@" \
  || status=$?
if compgen -G ".test-costs/*.jsonl" >/dev/null; then
  python3 scripts/test_costs.py .test-costs --top 10 | sed -n '/^Modules/,/^$/p'
fi
exit "$status"
