#!/bin/bash
# benchmarks/tune_vs_sweep.py --backend local, and benchmarks/manycore_lab.py (`lab`, below), on
# the lent many-core machine (no TensorFlow, no tflaunch there; nothing can be fetched there), in
# calls of at most 10 minutes.
#
# Here, once (CHECKOUT is the checkout the device tool sends, e.g. /work/main; TF is the folder
# with tf0 tf1 ... = tensorflow-cpu 2.21 cp312 as a zstd tar of site/ (its .so files stripped,
# tensorflow/include left out) split in pieces of at most 50 MB, tf.part00 in tf0 and so on, and
# tools = zstd, ip, tc, lib/ with their libraries, and the wheels TensorFlow needs that the
# device's Python lacks):
#   bash benchmarks/tune_vs_sweep_device.sh prepare CHECKOUT/.device TF [PEER]
# puts this worktree's committed code and tflaunch's own wheels into CHECKOUT/.device/tv and links
# nothing: every tf* piece and tools are copied beside it. Every call carries .device/tv and one
# more piece (four pieces in 2026-11: 155 MB):
#   call 1: carry [.device/tv, .device/tf0]           bash .device/tv/run.sh stage
#   call 2..: carry [.device/tv, .device/tfN]         bash .device/tv/run.sh stage
#   last:   carry [.device/tv, .device/tfLAST, .device/tools]
#           bash .device/tv/run.sh stage && bash .device/tv/run.sh run --budget 420 ARGS...
#   then:   carry [.device/tv]                        bash .device/tv/run.sh run --budget 480 ARGS...
# on one warm machine (it goes back after 30 s idle: chain the calls). `run` passes ARGS to
# tune_vs_sweep.py with --backend local --out /tmp/tune-vs-sweep/out (kept between calls on the warm machine,
# so a run goes on where the last stopped) and leaves $OUT/tvs.tgz: the results, each case's
# case.json, tune.txt and tune.json (no run logs).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
work=/tmp/tune-vs-sweep  # parts, site (TensorFlow and the wheels), tools, out (--out)

case "${1:-}" in
prepare)
    dest="${2:?give the .device folder of the checkout the device tool sends}"
    tf="${3:?give the folder with tf0 tf1 tf2 tools}"
    root="$(cd "$here/.." && pwd)"
    mkdir -p "$dest/tv/code" "$dest/tv/whl"
    (cd "$root" && git ls-files tflaunch models launchers benchmarks pyproject.toml \
        tests/__init__.py tests/helpers.py tests/hosts | tar -cf - -T -) | tar -xf - -C "$dest/tv/code"
    cp "$root/benchmarks/tune_vs_sweep_device.sh" "$dest/tv/run.sh"
    for piece in "$tf"/tf* "$tf/tools"; do
        [ -e "$dest/$(basename "$piece")" ] || cp -r "$piece" "$dest/"
    done
    if [ -n "${4:-}" ]; then  # the peer, for 'lab'
        mkdir -p "$dest/peer" && rm -rf "$dest/peer/tf_cnn_benchmarks"
        cp -r "$4" "$dest/peer/tf_cnn_benchmarks"
    fi
    # What the local backend imports that the device's Python may lack (the versions tested
    # here; rich only on a terminal, paramiko/pathspec/hostlist only for SSH and Slurm)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dest/tv/whl" click==8.5.1 PyYAML==6.0.4 psutil==7.2.2
    du -sh "$dest"/tv "$dest"/tf* "$dest"/tools
    ;;
stage)
    mkdir -p "$work/parts"
    cp .device/tf*/tf.part* "$work/parts"/ 2>/dev/null || true
    ls -la "$work/parts"
    if [ -d .device/tools ] && [ ! -d "$work/site/tensorflow" ]; then
        mkdir -p "$work/site"
        cp -r .device/tools "$work/tools"
        # the carried libraries for zstd alone: the device's Python keeps its own
        cat "$work/parts"/tf.part* | LD_LIBRARY_PATH="$work/tools/lib" "$work/tools/zstd" -d \
            --long=31 | tar -xf - -C "$work"  # site/
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$work/site" "$work"/tools/*.whl "$here"/whl/*.whl
        PYTHONPATH="$work/site" python3 -c 'import tensorflow as tf; print("tensorflow", tf.__version__)'
    fi
    ;;
run)
    shift
    [ -d "$work/site/tensorflow" ] || { echo "stage all three pieces and tools first" >&2; exit 2; }
    export PYTHONPATH="$work/site" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
    nproc
    set +e
    (cd "$here/code" && python3 benchmarks/tune_vs_sweep.py --backend local --out "$work/out" "$@") \
        2>&1 | tee "${OUT:-/tmp}/tvs.log"
    code=${PIPESTATUS[0]}
    (cd "$work/out" && find . -name results.json -o -name case.json -o -name tune.txt \
        -o -name tune.json -o -name '*.log' -path './w*' | tar -czf "${OUT:-/tmp}/tvs.tgz" -T -)
    exit "$code"
    ;;
lab)
    # benchmarks/manycore_lab.py on the staged TensorFlow: carry .device/peer too (prepare's
    # PEER: tf_cnn_benchmarks' scripts/tf_cnn_benchmarks folder, fetched, never committed).
    # ARGS go to manycore_lab.py; --results NAME is kept in $work/lab (seeded from the carried
    # code's benchmarks/results/NAME), so a call goes on where the last stopped on this machine,
    # and every run's store is written back under $OUT as it ends.
    shift
    [ -d "$work/site/tensorflow" ] || { echo "stage all three pieces and tools first" >&2; exit 2; }
    name="${LAB_RESULTS:-manycore_lab.json}"
    mkdir -p "$work/lab"
    [ -e "$work/lab/$name" ] || cp "$here/code/benchmarks/results/$name" "$work/lab/$name" 2>/dev/null || true
    export PYTHONPATH="$work/site" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
    nproc
    (cd "$here/code" && python3 benchmarks/manycore_lab.py --peer "$(cd "$here/../peer/tf_cnn_benchmarks" && pwd)" \
        --tools "$work/tools" --results "$work/lab/$name" --logs "$work/lab/logs" "$@") \
        2>&1 | tee "${OUT:-/tmp}/lab.log"
    code=${PIPESTATUS[0]}
    (cd "$work/lab" && tar -czf "${OUT:-/tmp}/lab-logs.tgz" --exclude='*netbench*' logs 2>/dev/null) || true
    exit "$code"
    ;;
*)
    echo "usage: $0 prepare DEVICE_DIR TF_DIR [PEER] | stage | run ARGS... | lab ARGS..." >&2
    exit 2
    ;;
esac
