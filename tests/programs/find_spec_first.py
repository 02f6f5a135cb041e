"""Run a Python program as ``__main__``, on worker:0 after first asking
``importlib.util.find_spec`` for tensorflow (a common library pattern; it used to disarm the
trace hook: no trace, and a verdict that no task had imported TensorFlow); every other task runs
it plainly.

    python tests/programs/find_spec_first.py PROGRAM.py [its arguments]
"""

import importlib.util
import os
import runpy
import sys

if os.environ["TFLAUNCH_TASK"] == "worker:0":
    assert importlib.util.find_spec("tensorflow") is not None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
