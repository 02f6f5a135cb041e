"""The ``lab`` cloud: instances that are network-namespace hosts on this machine, each with its own
sshd, a public and a private address and an optional link rate (root only). A second provider
beside EC2, in one folder: ``ssh.provision: {cloud: lab, rate: 1gbit}``."""

from tflaunch.launchers.clouds.lab.section import LabProvisionSection
from tflaunch.plugin import AdminOption, ProviderSpec

PROVIDER = ProviderSpec(
    name="lab",
    provider="tflaunch.launchers.clouds.lab.provider:LabProvider",
    section=LabProvisionSection,
    section_doc="make namespace hosts on this machine for the run (root)",
    admin_options=(
        AdminOption(
            "state_dir",
            "lab (the cloud of namespace hosts on this machine, examples/lab.yaml): its state "
            "directory (default: /run/tflaunch-lab).",
        ),
    ),
)
