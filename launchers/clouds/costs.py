"""What provisioned instances cost: a price per type and the table shown before anything is
created (the same for every cloud; each provider says where its prices come from)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tflaunch.text import aligned


@dataclasses.dataclass(frozen=True)
class Price:
    """An instance type's hourly price and where the figure came from."""

    instance_type: str
    hourly_usd: float | None
    source: str  # "cluster file", "AWS pricing API", "price list", or "unknown"


@dataclasses.dataclass(frozen=True)
class CostLine:
    """Instances of one role and type, and what they cost per hour."""

    role: str
    instance_type: str
    count: int
    spot: bool
    price: Price

    @property
    def hourly_usd(self) -> float | None:
        if self.price.hourly_usd is None:
            return None
        return self.price.hourly_usd * self.count


def cost_table(lines: Sequence[CostLine]) -> str:
    """The table printed before any instance is created, ending with the run's cost per hour."""
    rows = [("ROLE", "INSTANCES", "TYPE", "USD/HOUR EACH", "USD/HOUR", "PRICE FROM")]
    total = 0.0
    unknown = False
    for line in lines:
        each = line.price.hourly_usd
        spot = " (spot: at most)" if line.spot else ""
        rows.append(
            (
                line.role,
                str(line.count),
                line.instance_type,
                "?" if each is None else f"{each:.4f}{spot}",
                "?" if line.hourly_usd is None else f"{line.hourly_usd:.4f}",
                line.price.source,
            )
        )
        if line.hourly_usd is None:
            unknown = True
        else:
            total += line.hourly_usd
    count = sum(line.count for line in lines)
    out = aligned(rows)
    estimate = f"{total:.4f}" + (" + unknown prices" if unknown else "")
    out.append(f"estimated cost: USD {estimate} per hour for {count} instance(s)")
    if unknown:
        out.append("  (set ssh.provision.prices.<type> to price a type the list does not know)")
    return "\n".join(out)
