"""Local backend: every task on this machine (one agent per host of the plan), optionally shown in
one terminal window per task (``up --terminals``)."""

from tflaunch.plugin import BackendFeature, BackendSpec

BACKEND = BackendSpec(
    name="local",
    backend="tflaunch.launchers.local.backend:LocalBackend",
    default=True,
    features=frozenset({BackendFeature.TERMINALS}),  # up --terminals
)
