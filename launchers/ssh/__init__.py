"""SSH backend: the backend, host sessions, detached runs (launcher and host sides), connections,
pre-flight, host sources, and the ``ssh:`` section of the cluster file."""

from tflaunch.launchers.ssh.section import SshSection, check
from tflaunch.plugin import BackendFeature, BackendSpec

BACKEND = BackendSpec(
    name="ssh",
    backend="tflaunch.launchers.ssh.backend:SshBackend",
    section=SshSection,
    check=check,
    workdir_on_hosts=True,  # the program runs on the hosts, in a directory there
    features=frozenset({BackendFeature.KEEP}),  # up --keep: ssh.provision's machines
)
