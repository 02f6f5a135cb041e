"""Shared test helpers.

Tests that need root, network namespaces or system packages skip with a reason on a developer
laptop, and fail instead when ``CI`` is set: a green CI must mean they ran.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def skip_or_fail(reason: str) -> None:
    """Skip the test on a developer machine; fail it under CI, where every test must run."""
    if os.environ.get("CI"):
        pytest.fail(f"required in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture
def second_pid_namespace() -> None:
    """What :func:`tests.helpers.in_second_pid_namespace` needs: root and a working unshare."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        skip_or_fail("a second PID namespace needs root and unshare (util-linux)")
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        skip_or_fail(f"unshare --pid --fork --mount-proc fails here: {probe.stderr.strip()}")


@pytest.fixture(scope="module")
def ec2_endpoint():
    """moto's server on a free local port, standing in for the EC2 API."""
    moto_server = pytest.importorskip("moto.server")
    pytest.importorskip("boto3")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture()
def aws_credentials(monkeypatch, tmp_path):
    """Credentials for the stand-in only; no real profile or account is ever read."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a metadata service
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.delenv("AWS_PROFILE", raising=False)


# -- pytest-xdist: the Slurm test cluster is one per machine ---------------------------------------
# scripts/test.sh runs the suite on several workers (--dist loadgroup). The SSH test hosts come in
# sets, one per worker (tests/hosts/ssh_hosts.py), so their tests spread over the workers like any
# other. The Slurm test cluster is one per machine (fixed node names in /etc/hosts, slurmctld's
# fixed ports) behind a lock: a worker that waited on another's lock would idle. So every test of
# a module that imports it joins its group, which a single worker runs in turn, while the other
# tests spread over the rest.
_HOST_GROUPS = {"tests.hosts.slurm_cluster": "slurm-cluster"}


def _host_group(module: object) -> str | None:
    for value in vars(module).values():
        name = getattr(value, "__module__", None) or getattr(value, "__name__", None)
        if name in _HOST_GROUPS:
            return _HOST_GROUPS[name]
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    groups: dict[object, str | None] = {}
    for item in items:  # a module's group: from its own imports
        module = getattr(item, "module", None)
        if module is not None and module not in groups:
            groups[module] = _host_group(module)
    for item in items:
        group = groups.get(getattr(item, "module", None))
        if group:
            item.add_marker(pytest.mark.xdist_group(group))


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist (3.8) marks a test's group by rewriting its node id, which pytest 9 no longer
    lets it do: the grouped tests would spread over the workers, and one worker would wait on
    another's Slurm-cluster lock until it timed out. Refuse that pair before anything runs."""
    if config.getoption("dist", "no") == "loadgroup" and pytest.version_tuple >= (9,):
        raise pytest.UsageError(
            f"--dist loadgroup does not group tests under pytest {pytest.__version__} (pytest-xdist "
            "cannot mark groups there): install the versions in constraints.txt (scripts/test.sh "
            "does), or run with TEST_WORKERS=0."
        )


@pytest.fixture
def tiny_cnn(monkeypatch) -> str:
    """``--model tiny_cnn`` for the benchmark in this process (tests/tiny_cnn.py): the model
    table with the tiny CNN added for the test."""
    pytest.importorskip("tensorflow")
    from tests.tiny_cnn import SPEC
    from tflaunch.models import registry

    monkeypatch.setitem(registry.MODELS, SPEC.name, SPEC)
    return SPEC.name
