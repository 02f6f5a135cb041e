"""What EC2 instances cost per hour, and how many GPUs each type has.

A price comes from, in this order: the cluster file (``ssh.provision.prices``), AWS's pricing API
(where it can be reached: real AWS only, never asked when ``endpoint_url`` points at a stand-in),
or :data:`PRICE_LIST`, a small table shipped with tflaunch. Spot instances are shown at the
on-demand price as an upper bound: a spot price is known only once the instance runs.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from tflaunch.launchers.clouds.ec2.section import Ec2ProvisionSection
from tflaunch.plugin import ConfigError, Price


@dataclasses.dataclass(frozen=True)
class InstanceType:
    """A row of the packaged list: USD per hour (Linux, on demand, us-east-1) and GPUs."""

    hourly_usd: float
    gpus: int


# AWS list prices for us-east-1, Linux, on demand, shared tenancy (as published in 2024). Other
# regions differ by a few per cent; the pricing API or ssh.provision.prices give exact figures.
PRICE_LIST: dict[str, InstanceType] = {
    "t3.micro": InstanceType(0.0104, 0),
    "t3.medium": InstanceType(0.0416, 0),
    "t3.large": InstanceType(0.0832, 0),
    "m5.large": InstanceType(0.096, 0),
    "m5.xlarge": InstanceType(0.192, 0),
    "m5.2xlarge": InstanceType(0.384, 0),
    "c5.large": InstanceType(0.085, 0),
    "c5.xlarge": InstanceType(0.17, 0),
    "c5.2xlarge": InstanceType(0.34, 0),
    "c5.4xlarge": InstanceType(0.68, 0),
    "g4dn.xlarge": InstanceType(0.526, 1),
    "g4dn.12xlarge": InstanceType(3.912, 4),
    "g5.xlarge": InstanceType(1.006, 1),
    "g5.12xlarge": InstanceType(5.672, 4),
    "p3.2xlarge": InstanceType(3.06, 1),
    "p3.8xlarge": InstanceType(12.24, 4),
    "p3.16xlarge": InstanceType(24.48, 8),
    "p4d.24xlarge": InstanceType(32.7726, 8),
}

# The pricing API names regions by their long names.
REGION_NAMES = {
    "us-east-1": "US East (N. Virginia)",
    "us-east-2": "US East (Ohio)",
    "us-west-1": "US West (N. California)",
    "us-west-2": "US West (Oregon)",
    "eu-west-1": "EU (Ireland)",
    "eu-central-1": "EU (Frankfurt)",
    "ap-northeast-1": "Asia Pacific (Tokyo)",
    "ap-southeast-1": "Asia Pacific (Singapore)",
}


def gpus_of(instance_type: str) -> int:
    """GPUs of an instance type from the packaged list (0 for a type it does not know)."""
    known = PRICE_LIST.get(instance_type)
    return known.gpus if known else 0


def resolve_prices(
    section: Ec2ProvisionSection,
    types: Sequence[str],
    ask_api: Callable[[str, str], float | None] | None = None,
) -> dict[str, Price]:
    """The price of every instance type in ``types``; ``ask_api(type, region)`` is the API."""
    overrides = _overrides(section)
    use_api = section.pricing_api and section.endpoint_url is None
    ask = ask_api or api_price
    prices = {}
    for name in dict.fromkeys(types):
        if name in overrides:
            prices[name] = Price(name, overrides[name], "cluster file")
            continue
        figure = ask(name, section.region or "us-east-1") if use_api else None
        if figure is not None:
            prices[name] = Price(name, figure, "AWS pricing API")
        elif name in PRICE_LIST:
            prices[name] = Price(name, PRICE_LIST[name].hourly_usd, "price list")
        else:
            prices[name] = Price(name, None, "unknown")
    return prices


def _overrides(section: Ec2ProvisionSection) -> dict[str, float]:
    out = {}
    for name, text in section.prices.items():
        try:
            out[name] = float(text)
        except ValueError:
            raise ConfigError(
                f"ssh.provision.prices.{name}: '{text}' is not a number; write USD per hour, "
                "e.g. 3.06."
            ) from None
        if out[name] < 0:
            raise ConfigError(f"ssh.provision.prices.{name}: a price cannot be negative.")
    return out


def api_price(instance_type: str, region: str) -> float | None:
    """The on-demand Linux price from AWS's pricing API, or None if it cannot be had quickly."""
    location = REGION_NAMES.get(region)
    if location is None:
        return None
    try:
        import boto3
        import botocore.config

        client = boto3.client(
            "pricing",
            region_name="us-east-1",
            config=botocore.config.Config(
                connect_timeout=3, read_timeout=5, retries={"total_max_attempts": 1}
            ),
        )
        filters = {
            "instanceType": instance_type,
            "location": location,
            "operatingSystem": "Linux",
            "tenancy": "Shared",
            "preInstalledSw": "NA",
            "capacitystatus": "Used",
        }
        reply = client.get_products(
            ServiceCode="AmazonEC2",
            Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
            MaxResults=1,
        )
        return on_demand_usd(reply.get("PriceList", []))
    except Exception:  # no credentials, no network, no permission: the list price is used
        return None


def on_demand_usd(price_list: Sequence[str]) -> float | None:
    """The hourly USD figure in a pricing API answer (JSON documents as strings)."""
    for document in price_list:
        product: dict[str, Any] = json.loads(document)
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if usd is not None and float(usd) > 0:
                    return float(usd)
    return None
