"""tflaunch: run distributed TensorFlow clusters from one YAML file."""

__version__ = "0.1.0"
