"""The folder ``tflaunch up --trace`` puts first on every task's ``PYTHONPATH``: it holds only
``sitecustomize.py``, the trace hook (see ``tflaunch.runtime.tracehook``)."""
