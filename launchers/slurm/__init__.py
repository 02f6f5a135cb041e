"""Slurm backend: the login-node backend, the Slurm command client, the job script, the
node-side entry point, and the ``slurm:`` section of the cluster file."""

from tflaunch.launchers.slurm.section import SlurmSection, check
from tflaunch.plugin import BackendSpec

BACKEND = BackendSpec(
    name="slurm",
    backend="tflaunch.launchers.slurm.backend:SlurmBackend",
    section=SlurmSection,
    check=check,
)
