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
#
# Lanes (issue 43's run, 2026-11-29): TF may also hold kit/ (paramiko's cp312 wheels and their
# needs, hostlist.py under site/, ssh.tgz: sshd and ssh-keygen with the libraries ldd lists, less
# glibc's), copied like the pieces; carried in call 1 beside tf0, `stage` installs it (wrappers
# at /usr/sbin/sshd and /usr/bin/ssh-keygen where the machine has none, the sshd user, ip and tc
# wrappers) and logs in once through a loopback sshd. Then, after the last piece:
#   bash .device/tv/run.sh lane A 0-7 --backend local --cpus-per-task 1 --cases ... ARGS
#   bash .device/tv/run.sh lane B 8-11 --backend ssh --hosts 5 --cases ... ARGS
#   bash .device/tv/run.sh poll 520          # and again each call: carry [.device/tv] alone
# Each lane is tune_vs_sweep.py on disjoint cores (taskset: launcher, tasks and SSH test hosts
# alike), in a session of its own, so it runs on between calls; `poll S` returns when every
# lane has ended or after S seconds, with $OUT/lanes.tgz (results, case.json, point files,
# tune.json, inputs.json, netbench.json, tune.txt, each lane's log). The lanes share the
# machine's memory and caches: say so beside their figures.
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
    for piece in "$tf"/tf* "$tf/tools" $([ -d "$tf/kit" ] && echo "$tf/kit"); do
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
    # The SSH kit (prepare's KIT, for --backend ssh: paramiko's wheels, sshd and ssh-keygen
    # with their libraries), carried in any one call; set up with TensorFlow.
    if [ -d .device/kit ] && [ ! -d "$work/kit" ]; then cp -r .device/kit "$work/kit"; fi
    if [ -d "$work/kit" ] && [ ! -e "$work/kit.done" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$work/site" "$work"/kit/whl/*.whl
        cp "$work"/kit/site/* "$work/site/"
        tar -xzf "$work/kit/ssh.tgz" -C "$work/kit"  # ssh/: sshd.bin, ssh-keygen.bin, lib/
        mkdir -p "$work/bin"
        for pair in /usr/sbin/sshd:sshd.bin /usr/bin/ssh-keygen:ssh-keygen.bin; do
            [ -e "${pair%%:*}" ] || printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' \
                "$work/kit/ssh/lib" "$work/kit/ssh/${pair##*:}" >"${pair%%:*}"
            chmod 755 "${pair%%:*}"
        done
        id sshd >/dev/null 2>&1 || useradd -r -d /run/sshd -s /usr/sbin/nologin sshd
        for tool in ip tc; do  # the carried tools where the machine has none
            command -v "$tool" >/dev/null || printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' \
                "$work/tools/lib" "$work/tools/$tool" >"$work/bin/$tool"
            chmod 755 "$work/bin/$tool" 2>/dev/null || true
        done
        touch "$work/kit.done"
        # sshd on loopback, a key login through paramiko: what the SSH test hosts rely on
        k="$work/kit/smoke" && mkdir -p "$k" /run/sshd && rm -f "$k"/key*
        ssh-keygen -q -t ed25519 -N '' -f "$k/key" && ssh-keygen -q -t ed25519 -N '' -f "$k/hostkey"
        printf 'Port 2299\nListenAddress 127.0.0.1\nHostKey %s\nAuthorizedKeysFile %s\nPidFile %s\nStrictModes no\nUsePAM no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n' \
            "$k/hostkey" "$k/key.pub" "$k/pid" >"$k/config"
        /usr/sbin/sshd -f "$k/config" -E "$k/log" && sleep 1
        PATH="$work/bin:$PATH" PYTHONPATH="$work/site" python3 -c '
import sys, paramiko
sys.path.insert(0, sys.argv[2])
from tests.hosts import ssh_hosts
c = paramiko.SSHClient(); c.set_missing_host_key_policy(paramiko.AutoAddPolicy())
c.connect("127.0.0.1", 2299, "root", key_filename=sys.argv[1] + "/key")
print("ssh smoke:", c.exec_command("echo hello from $(hostname)")[1].read().decode().strip())
print("paramiko", paramiko.__version__, "missing:", ssh_hosts.missing_requirements())' \
            "$k" "$here/code" || cat "$k/log"
        kill "$(cat "$k/pid")" 2>/dev/null || true
    fi
    ;;
lane)
    # bash run.sh lane NAME CORES ARGS...: tune_vs_sweep.py ARGS --out $work/NAME, bound to
    # CORES (taskset: its launcher, tasks and test hosts on those cores only), in a session of
    # its own so that it outlives the call (the machine keeps it until it goes back); several
    # lanes on disjoint cores run side by side. `poll` waits for them and returns the results.
    name="$2" cores="$3"
    shift 3
    [ -d "$work/site/tensorflow" ] || { echo "stage all pieces and tools first" >&2; exit 2; }
    # Lanes run from a copy: each call's carried .device/tv replaces the one there, and a lane
    # still running from it lost its files mid-run (2026-11-29: two sweep points failed so).
    [ -d "$work/code" ] || cp -r "$here/code" "$work/code"
    (
        export PATH="$work/bin:$PATH" PYTHONPATH="$work/site" PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
        cd "$work/code"
        setsid nohup taskset -c "$cores" python3 benchmarks/tune_vs_sweep.py --out "$work/$name" \
            "$@" >"$work/$name.log" 2>&1 </dev/null &
        echo $! >"$work/$name.pid"
    )
    echo "lane $name on cores $cores: pid $(cat "$work/$name.pid")"
    ;;
poll)
    # bash run.sh poll SECONDS: wait until every lane has ended or SECONDS passed; each lane's
    # last lines, and $OUT/lanes.tgz with what `run` returns (plus tune's inputs) for every lane.
    end=$((SECONDS + ${2:-0}))
    while [ $SECONDS -lt $end ]; do
        alive=0
        for f in "$work"/*.pid; do [ -e "$f" ] && kill -0 "$(cat "$f")" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        sleep 5
    done
    for f in "$work"/*.pid; do
        [ -e "$f" ] || continue
        n="$(basename "$f" .pid)"
        state=ended; kill -0 "$(cat "$f")" 2>/dev/null && state=running
        echo "=== lane $n ($state)"; grep -v '^\[' "$work/$n.log" | tail -n 25
    done
    (cd "$work" && find . -maxdepth 1 -name '*.log' >/tmp/lanes.list
     for f in "$work"/*.pid; do
         n="$(basename "$f" .pid)"
         [ -d "$work/$n" ] && (cd "$work" && find "$n" \( -name results.json -o -name case.json \
             -o -name tune.txt -o -name tune.json -o -name inputs.json -o -name netbench.json \
             -o -name 'point*.yaml' -o -name '*.log' \) -not -path '*/remote/*' \
             -not -path '*/runs/*/runs/*' -not -path '*/runs/*/*/*' ) >>/tmp/lanes.list
     done
     tar -czf "${OUT:-/tmp}/lanes.tgz" -T /tmp/lanes.list) || true
    ls -la "${OUT:-/tmp}/lanes.tgz"
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
    echo "usage: $0 prepare DEVICE_DIR TF_DIR [PEER] | stage | run ARGS... | lab ARGS... |" \
        "lane NAME CORES ARGS... | poll SECONDS" >&2
    exit 2
    ;;
esac
