"""The EC2 API client, from a section with region, profile and endpoint_url, and its errors as
tflaunch's. boto3 is the optional 'aws' extra, imported only here and only when EC2 is asked for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from tflaunch.plugin import ConfigError, LaunchError, MissingExtra


class Account(Protocol):
    """Where the EC2 API is: what ``ssh.ec2``, ``ssh.provision`` and a run's recorded access
    (:class:`~tflaunch.launchers.clouds.ec2.provider.Access`) all say."""

    @property
    def region(self) -> str | None: ...
    @property
    def profile(self) -> str | None: ...
    @property
    def endpoint_url(self) -> str | None: ...


def ec2_client(section: Account, key: str = "ssh.ec2") -> Any:
    """A boto3 EC2 client for a cluster-file section with region, profile and endpoint_url
    (``ssh.ec2`` or ``ssh.provision``, named by ``key`` in the errors, or a run's recorded
    access). boto3 is the optional 'aws' extra, imported only here and only when EC2 is asked
    for."""
    try:
        import boto3
        import botocore.exceptions
    except ImportError as err:
        raise MissingExtra(
            f"{key} needs boto3, which is not installed: pip install 'tflaunch[aws]'.",
            package="boto3",
            extra="aws",
        ) from err
    try:
        session = _session(boto3, section.profile, section.region)
        return session.client("ec2", endpoint_url=section.endpoint_url)
    except botocore.exceptions.ProfileNotFound as err:
        raise ConfigError(
            f"{key}.profile: {err}. Name a profile from ~/.aws/config or drop 'profile' to use "
            "the AWS environment."
        ) from err
    except botocore.exceptions.NoRegionError as err:
        raise ConfigError(
            f"{key}: no AWS region: set '{key}.region', AWS_DEFAULT_REGION, or a region in "
            "your AWS profile."
        ) from err


_MODELS: dict[str | None, Any] = {}  # botocore's data loader by data path, one per process
_MODELS_LOCK = threading.Lock()


def _session(boto3: Any, profile: str | None, region: str | None) -> Any:
    """A boto3 session of its own (its profile, region and credentials), sharing one botocore
    data loader with every other session of this process: the loader parses the service models
    (EC2's is megabytes of JSON, about 0.4 s of CPU) once, where a fresh one would parse them for
    each client, and a run makes several (the provider, its watch, each recorded access)."""
    import botocore.session

    core = botocore.session.get_session()
    if profile:
        core.set_config_variable("profile", profile)
    data_path = core.get_config_variable("data_path")  # AWS_DATA_PATH, or the profile's
    with _MODELS_LOCK:
        if data_path in _MODELS:
            core.register_component("data_loader", _MODELS[data_path])
        session = boto3.Session(botocore_session=core, profile_name=profile, region_name=region)
        loader = _MODELS.setdefault(data_path, core.get_component("data_loader"))
        loader.search_paths[:] = dict.fromkeys(loader.search_paths)  # boto3 adds one per session
    return session


@contextmanager
def aws_errors(doing: str) -> Iterator[None]:
    """AWS client errors as LaunchErrors that say what was being done."""
    import botocore.exceptions

    try:
        yield
    except botocore.exceptions.NoCredentialsError as err:
        raise LaunchError(
            f"{doing}: no AWS credentials. Set ssh.provision.profile, or AWS_PROFILE / "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, as for the aws CLI."
        ) from err
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as err:
        raise LaunchError(f"{doing}: AWS refused ({err}).") from err
