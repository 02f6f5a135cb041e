"""Tracing: ``tflaunch up --trace`` of any Python TensorFlow program, from the option to
``trace.json``, and ``tflaunch trace RUN``. One package, in the order a trace is made:

- :mod:`~tflaunch.trace.request` — the request, one typed value from ``up``'s options to the
  agents (``LaunchOptions.trace``, every task's environment through ``to_env``/``from_env``);
- :mod:`~tflaunch.trace.files` — the trace directory of each host, the hook's place in a task's
  environment (the hook itself is ``tflaunch/tracehook``, which imports nothing of tflaunch), its
  notes, and the verdict;
- :mod:`~tflaunch.trace.links` — the agent's part: notes, window and files over its link;
- :mod:`~tflaunch.trace.site` — where the capture runs and how the hosts' files meet (the
  coordinator's machine; a backend may subclass it: ``launchers/ssh/trace.py``);
- :mod:`~tflaunch.trace.window` — the window policy: when the capture opens, and the verdict;
- :mod:`~tflaunch.trace.capture` — the capture helper (TensorFlow's profiler client);
- :mod:`~tflaunch.trace.profiler` — the TensorFlow side: XPlanes decoded and merged, and the
  tracer of programs that take their own trace (the benchmark);
- :mod:`~tflaunch.trace.format`, :mod:`~tflaunch.trace.transfers` — ``trace.json``, the summary
  and the transfer figures, without TensorFlow;
- :mod:`~tflaunch.trace.show` — the summary printed and the timeline drawn.

Only ``capture`` and ``profiler`` import TensorFlow (import contracts in pyproject.toml), and
only when they run: importing this package costs nothing.
"""
