"""What the cluster programs here share: their usage error, positive-number flags, and the one
line a failed task prints before its exit code. No TensorFlow."""

from __future__ import annotations

import argparse
import sys


class UsageError(Exception):
    """Bad flags or cluster description (exit 2); the message says what to fix."""


def positive_int(text: str) -> int:
    """An argparse type: an integer above 0."""
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def error_exit(task: str, error: object, code: int) -> int:
    """Print ``TASK: error: ERROR`` on stderr; return ``code``, the task's exit code."""
    print(f"{task}: error: {error}", file=sys.stderr, flush=True)
    return code
