"""The cloud tests' fixtures, from one module (tests/cloud/fixtures.py); the SSH test hosts' too,
which play the instances."""

from tests.cloud.fixtures import (  # noqa: F401 (fixtures)
    aws_env,
    clean_region,
    cloud_file,
    region_left_clean,
)
from tests.ssh.fixtures import ssh_test_hosts  # noqa: F401 (the session fixture)
