"""The benchmark (``python -m tflaunch.models.benchmark``) with the tiny CNN of tests/tiny_cnn.py
in its model table, for real clusters whose subject is the benchmark's modes, transfers and
totals rather than the network: ``--model tiny_cnn --image_size 8``. Needs this checkout on
PYTHONPATH.

    python tests/programs/tiny_benchmark.py [the benchmark's flags]
"""

import sys

from tests.tiny_cnn import SPEC
from tflaunch.models import registry

registry.MODELS[SPEC.name] = SPEC

from tflaunch.models.benchmark import main  # noqa: E402

sys.exit(main())
