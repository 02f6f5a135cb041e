"""SSH backend: the backend, host sessions, detached runs (launcher and host sides), connections, pre-flight and host sources."""
