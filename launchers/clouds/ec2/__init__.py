"""EC2 as a cloud provider (boto3, the optional aws extra): provisioning, prices, kept clusters,
spot workers, and host discovery (``ssh.ec2``)."""

from tflaunch.launchers.clouds.ec2.section import Ec2ProvisionSection, Ec2Section
from tflaunch.plugin import AdminOption, Feature, ProviderSpec

PROVIDER = ProviderSpec(
    name="ec2",
    provider="tflaunch.launchers.clouds.ec2.provider:Ec2Provider",
    section=Ec2ProvisionSection,
    section_doc="create EC2 instances for the run",
    features=frozenset({Feature.KEEP, Feature.SPOT}),
    admin_options=(
        AdminOption(
            "region", "AWS region (default: the cluster file's, else the AWS environment)."
        ),
        AdminOption("profile", "AWS profile (default: the cluster file's)."),
        AdminOption("endpoint_url", "EC2 API endpoint (tests).", hidden=True),
    ),
    discovery=Ec2Section,
    discovery_doc="discover hosts from EC2",
    discover="tflaunch.launchers.clouds.ec2.discover:discover_ec2",
    default=True,
)
