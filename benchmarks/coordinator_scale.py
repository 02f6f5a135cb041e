"""The coordinator with thousands of agents: how long one task's failure takes to reach every
agent as a stop, and what the coordinator's process costs in CPU meanwhile.

Two processes. The coordinator process is tflaunch's own: it publishes its address and a one-run
token, accepts every agent's hello over TCP (as the first node of a Slurm job does), then runs
the real ``Coordinator`` over those links with a plan of N nodes x 8 workers plus a PS per 8
nodes. The driver process (this script) plays N fake agents over real sockets in one thread: each
says hello with the token, waits for ``start``, reports its tasks started (and its PS ready), then
sends resource samples as a real agent of that cluster does — a real sample's JSON, taken from
this machine with the agent's own sampler — every ``cluster_sample_interval`` seconds (1 s up to
512 agents, longer beyond; SCALE_SAMPLE_INTERVAL=1 sets the configured interval, 0 none), the
agents spread evenly over the interval. After a steady period one worker exits with
code 1; every agent then reports its tasks stopped once it receives ``stop``, as a real agent does.

Printed per agent count: the coordinator's CPU (% of one core) while samples stream in, connect →
cluster ready, failure → the last agent told to stop (and the median agent), the coordinator's
peak RSS. The coordinator process is killed if its RSS passes --memory-limit-mb.

Usage: python benchmarks/coordinator_scale.py [--agents 64 512 4096] [--steady 10]
(--steady: seconds of samples measured; make it at least one sampling interval.)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tflaunch.runtime import protocol  # noqa: E402

TASKS_PER_AGENT = 8
SAMPLE_INTERVAL = float(os.environ.get("SCALE_SAMPLE_INTERVAL", "1"))  # the configured one; 0: none


# ---- the coordinator process ---------------------------------------------------------------------


def serve(agents: int, run_dir: Path, sample_interval: float) -> int:
    """Accept ``agents`` agents and coordinate them until the run ends (the process under test)."""
    from tflaunch.runtime.coordinator import coordinate
    from tflaunch.runtime.rendezvous import Listener, Rendezvous, publish
    from tflaunch.runtime.run import Run

    plan = fake_plan(agents, sample_interval)
    run = Run("scale", run_dir)
    run.write_plan(plan)
    record = Rendezvous.ahead()
    listener = Listener("127.0.0.1", record.token, {h.name for h in plan.hosts})
    publish(run_dir, record.listening(listener))
    links = [joined.link for joined in listener.accept(timeout=300).values()]
    if len(links) != agents:
        print(f"only {len(links)} of {agents} agents connected", file=sys.stderr)
        return 1
    for link in links:
        link.send(protocol.Start().wire())
    with open(os.devnull, "w") as quiet:
        outcome = coordinate(plan, run, links, out=quiet)
    return 0 if outcome.code == 1 else 3


def fake_plan(agents: int, sample_interval: float):
    from tflaunch.cluster.config import parse_config
    from tflaunch.cluster.placement import make_plan
    from tflaunch.cluster.plan import Host

    text = json.dumps(
        {
            "name": "scale",
            "program": {"argv": ["train", "{cluster_file}"], "tf_config": False},
            "roles": {"ps": max(1, agents // 8), "worker": agents * TASKS_PER_AGENT},
            "placement": {"workers_per_host": TASKS_PER_AGENT},
            "supervision": {"sample_interval": sample_interval, "grace_period": 1},
        }
    )
    hosts = [Host(f"n{i:05d}", f"n{i:05d}", f"n{i:05d}") for i in range(agents)]
    return make_plan(parse_config(text), hosts)


# ---- the driver: N fake agents in one thread -----------------------------------------------------


class FakeAgent:
    def __init__(self, host: str, tasks: list[str], sock: socket.socket):
        self.host, self.tasks, self.sock = host, tasks, sock
        self.inbox = b""
        self.outbox = bytearray()
        self.started = False
        self.stopped_at: float | None = None
        self.closed = False
        self.next_sample = 0.0

    def send(self, event: protocol.Event) -> None:
        self.send_wire(event.wire())

    def send_wire(self, data: dict) -> None:
        line = json.dumps({"time": round(time.time(), 3), "host": self.host, **data})
        self.outbox += line.encode() + b"\n"


def real_sample() -> dict:
    """One sample event as an agent with 8 tasks sends it (the node's figures are this machine's)."""
    from tflaunch.runtime.monitor import TreeSampler

    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(TASKS_PER_AGENT)]
    try:
        sampler = TreeSampler()
        pids = {f"worker:{i}": p.pid for i, p in enumerate(sleepers)}
        sampler.sample(pids)
        time.sleep(0.2)
        return protocol.Sample(sampler.sample(pids)).wire()
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


class Driver:
    def __init__(self, agents: int, run_dir: Path, coordinator: subprocess.Popen, limit_mb: int):
        self.n, self.run_dir, self.coordinator, self.limit_mb = (
            agents,
            run_dir,
            coordinator,
            limit_mb,
        )
        self.selector = selectors.DefaultSelector()
        self.agents: list[FakeAgent] = []
        self.sample = real_sample()
        from tflaunch.runtime.monitor import cluster_sample_interval

        # what real agents of a cluster this size send: tflaunch slows them for big clusters
        self.sample_interval = cluster_sample_interval(SAMPLE_INTERVAL, agents)
        self.peak_rss_mb = 0.0

    def connect(self) -> None:
        from tflaunch.cluster.plan import Plan
        from tflaunch.runtime.rendezvous import connect, read_published

        deadline = time.monotonic() + 60
        while (info := read_published(self.run_dir)) is None:
            if time.monotonic() > deadline or self.coordinator.poll() is not None:
                raise SystemExit("the coordinator did not publish its address")
            time.sleep(0.05)

        plan = Plan.from_dict(json.loads((self.run_dir / "plan.json").read_text()))
        for host in plan.hosts:
            sock = connect(info.address, info.port, info.token, host.name, 30)
            sock.setblocking(False)
            agent = FakeAgent(host.name, [t.name for t in plan.tasks_on(host.name)], sock)
            self.agents.append(agent)
            self.selector.register(sock, selectors.EVENT_READ, agent)

    def pump(self, seconds: float, until=None) -> None:
        """Read commands, send due samples and queued events, for ``seconds`` or until ``until()``."""
        end = time.monotonic() + seconds
        n = len(self.agents)
        while time.monotonic() < end and not (until and until()):
            now = time.monotonic()
            for i, agent in enumerate(self.agents):
                if (
                    self.sample_interval > 0
                    and agent.started
                    and agent.stopped_at is None
                    and now >= agent.next_sample
                ):
                    if agent.next_sample == 0.0:  # spread the agents evenly over the interval
                        agent.next_sample = now + self.sample_interval * i / n
                        continue
                    agent.next_sample += self.sample_interval
                    agent.send_wire({**self.sample, "time": round(time.time(), 3)})
            for key, mask in self.selector.select(timeout=0.01):
                agent = key.data
                if mask & selectors.EVENT_READ:
                    self._read(agent)
            for agent in self.agents:
                self._flush(agent)
            self._watch_memory()

    def _read(self, agent: FakeAgent) -> None:
        try:
            data = agent.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(agent)
            return
        agent.inbox += data
        *lines, agent.inbox = agent.inbox.split(b"\n")
        for line in lines:
            command = protocol.command_of(json.loads(line))
            if isinstance(command, protocol.Start) and not agent.started:
                agent.started = True
                agent.send(protocol.AgentStarted(pid=1, tasks=agent.tasks))
                for pid, task in enumerate(agent.tasks, start=100):
                    agent.send(protocol.Started(task=task, pid=pid, log="-"))
                    if task.startswith("ps:"):
                        agent.send(protocol.Ready(task=task))
                agent.send(protocol.HostStarted())
            elif isinstance(command, protocol.Stop) and agent.stopped_at is None:
                agent.stopped_at = time.perf_counter()
                agent.send(protocol.Stopping(tasks=agent.tasks, reason="stop"))
                for task in agent.tasks:
                    agent.send(protocol.Exited(task=task, code=143))
                agent.send(protocol.AgentExit(reason="stop"))

    def _flush(self, agent: FakeAgent) -> None:
        if not agent.outbox or agent.closed:
            return
        try:
            sent = agent.sock.send(agent.outbox)
            del agent.outbox[:sent]
        except BlockingIOError:
            return
        except OSError:
            self._close(agent)
            return
        if not agent.outbox and agent.stopped_at is not None:
            self._close(agent)

    def _close(self, agent: FakeAgent) -> None:
        if not agent.closed:
            agent.closed = True
            self.selector.unregister(agent.sock)
            agent.sock.close()

    def _watch_memory(self) -> None:
        rss = rss_mb(self.coordinator.pid)
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        if rss > self.limit_mb:
            self.coordinator.kill()
            raise SystemExit(f"the coordinator passed {self.limit_mb} MB RSS; killed")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def bench(agents: int, steady: float, limit_mb: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="coordinator-scale-") as tmp:
        run_dir = Path(tmp)
        coordinator = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(agents), "--run-dir", tmp],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            # Its threads reserve address space far beyond what they touch: it is bounded by
            # the RSS watch in the driver instead of this script's address-space limit.
            preexec_fn=lambda: resource.setrlimit(
                resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
            ),
        )
        try:
            driver = Driver(agents, run_dir, coordinator, limit_mb)
            started = time.perf_counter()
            driver.connect()
            driver.pump(120, until=lambda: _cluster_ready(run_dir))
            ready_s = time.perf_counter() - started
            driver.pump(2)  # settle: every agent has started sampling
            cpu_before, window_start = cpu_seconds(coordinator.pid), time.perf_counter()
            driver.pump(steady)
            steady_cpu = (cpu_seconds(coordinator.pid) - cpu_before) / (
                time.perf_counter() - window_start
            )
            victim = driver.agents[len(driver.agents) // 2]
            failed_task = next(t for t in victim.tasks if t.startswith("worker:"))
            cpu_before = cpu_seconds(coordinator.pid)
            victim.send(protocol.Exited(task=failed_task, code=1))
            driver._flush(victim)
            failed_at = time.perf_counter()
            driver.pump(60, until=lambda: all(a.stopped_at for a in driver.agents))
            told = sorted(a.stopped_at - failed_at for a in driver.agents if a.stopped_at)
            stop_cpu = cpu_seconds(coordinator.pid) - cpu_before
            driver.pump(30, until=lambda: coordinator.poll() is not None)
        finally:
            if coordinator.poll() is None:
                coordinator.kill()
            coordinator.wait()
    return {
        "agents": agents,
        "tasks": agents * TASKS_PER_AGENT + max(1, agents // 8),
        "connect_to_ready_s": ready_s,
        "steady_cpu_percent": 100 * steady_cpu,
        "failure_to_last_stop_s": told[-1] if len(told) == agents else None,
        "failure_to_median_stop_s": statistics.median(told) if told else None,
        "agents_told": len(told),
        "stop_cpu_s": stop_cpu,
        "coordinator_peak_rss_mb": driver.peak_rss_mb,
        "coordinator_exit": coordinator.returncode,
        "sample_interval": driver.sample_interval,
    }


def _cluster_ready(run_dir: Path) -> bool:
    try:
        return '"cluster_ready"' in (run_dir / "events.jsonl").read_text()
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[64, 512, 4096])
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of samples measured")
    parser.add_argument("--memory-limit-mb", type=int, default=3000)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a socket (and a file) per agent
    if args.serve:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        return serve(args.serve, Path(args.run_dir), SAMPLE_INTERVAL)
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, resource.RLIM_INFINITY))
    results = []
    for agents in args.agents:
        r = bench(agents, args.steady, args.memory_limit_mb)
        results.append(r)
        last = r["failure_to_last_stop_s"]
        print(
            f"{agents:>5} agents ({r['tasks']:>6} tasks): coordinator CPU "
            f"{r['steady_cpu_percent']:.0f} % of a core with samples every "
            f"{r['sample_interval']:g} s per agent | connect -> ready "
            f"{r['connect_to_ready_s']:.2f} s | failure -> all told to stop "
            + (f"{last:.3f} s" if last is not None else f"{r['agents_told']} of {agents} told")
            + f" (median agent {r['failure_to_median_stop_s'] or 0:.3f} s, coordinator CPU "
            f"{r['stop_cpu_s']:.2f} s) | coordinator peak RSS {r['coordinator_peak_rss_mb']:.0f} MB",
            flush=True,
        )
    if args.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
