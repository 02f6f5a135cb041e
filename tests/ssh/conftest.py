"""The SSH tests' fixtures, from one module (tests/ssh/fixtures.py)."""

from tests.ssh.fixtures import ssh_test_hosts  # noqa: F401 (the session fixture)
