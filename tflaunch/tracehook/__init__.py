"""The folder ``tflaunch up --trace`` puts first on every traced task's ``PYTHONPATH``: the trace
hook (``sitecustomize.py``) and its fix for a crash in TensorFlow's profiler (``profiler_fix.cc``;
see README.md here). It runs inside the user's program and imports nothing of tflaunch (an import
contract in pyproject.toml; scripts/hook_imports.py checks it uses the standard library only)."""
