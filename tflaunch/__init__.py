"""tflaunch: run distributed TensorFlow clusters from one YAML file."""

import os as _os

__version__ = "0.1.0"

# An installed tflaunch holds its subpackages launchers and models inside the package; a source
# checkout keeps them as the repository's top-level folders (pyproject.toml maps them). Searching
# the checkout's root too lets `PYTHONPATH=checkout python -m tflaunch ...` work uninstalled,
# and keeps a second checkout from importing the first one's through its editable install.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
    _os.path.join(_root, "launchers", "base.py")
):
    __path__.append(_root)
