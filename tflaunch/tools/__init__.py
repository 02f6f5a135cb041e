"""Tools built on the core: the benchmark sweep, the variable-placement report, run reports and status tables."""
