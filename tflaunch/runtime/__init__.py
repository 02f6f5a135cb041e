"""Running a plan: the agent on each node, the coordinator that applies the cluster's policy, the
links between them, task processes, restarts, stall watchdog, monitoring and the run directory."""
