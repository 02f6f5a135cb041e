"""The ``lab`` cloud: instances that are network-namespace hosts on this machine, each with its own
sshd, a public and a private address and an optional link rate (root only)."""
