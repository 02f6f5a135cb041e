"""Slurm backend: the login-node backend, the Slurm command client, the job script, and the node-side entry point."""
