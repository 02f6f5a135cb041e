"""Write a small ImageNet-layout TFRecord set of random JPEGs (the benchmark's ``--data_dir``)::

    python -m tflaunch.models.tfrecords --out /tmp/imagenet-mini --num_images 256 --image_size 96 \\
        --num_classes 10

The layout and the reader are in :mod:`tflaunch.models.data.imagenet`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow's C++ runtime loads

from tflaunch.models.data.imagenet import write_dataset  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tflaunch.models.tfrecords",
        description="Write a small ImageNet-layout TFRecord set of random JPEGs.",
    )
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--num_images", type=int, default=256)
    parser.add_argument("--image_size", type=int, default=96, help="JPEG width and height")
    parser.add_argument("--num_classes", type=int, default=10, help="labels are 1..num_classes")
    parser.add_argument("--num_shards", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        paths = write_dataset(
            args.out, args.num_images, args.image_size, args.num_classes, args.num_shards, args.seed
        )
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.num_images} images in {len(paths)} shards to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
