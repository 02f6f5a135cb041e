"""Regenerate inception_v3_variables.json: Keras InceptionV3's trainable variables.

The placement arithmetic tests read this file instead of building the model, so they run without
TensorFlow. Order is creation order (what a device setter sees), not Keras's layer-graph order.
tests/test_placement.py checks that the file still matches Keras.

    python tests/data/make_inception_v3_variables.py
"""

from __future__ import annotations

import json
from pathlib import Path

FIXTURE = Path(__file__).with_name("inception_v3_variables.json")


def keras_inception_v3_document() -> dict:
    """The fixture's content, from Keras's InceptionV3 (weights=None, 1000 classes)."""
    import tensorflow as tf

    from tflaunch.models.placement import created_variables

    # Keras numbers layer names per process ("conv2d_94"): start from a clean slate so the
    # names do not depend on which models this process built before.
    tf.keras.backend.clear_session()
    specs = created_variables(lambda: tf.keras.applications.InceptionV3(weights=None, classes=1000))
    return {
        "source": "tf.keras.applications.InceptionV3(weights=None, classes=1000), trainable "
        f"variables in creation order; TensorFlow {tf.__version__}",
        "variables": [[s.name, list(s.shape), s.dtype_size] for s in specs],
    }


def main() -> None:
    document = keras_inception_v3_document()
    rows = ",\n".join(f"  {json.dumps(row)}" for row in document["variables"])
    FIXTURE.write_text(
        f'{{\n "source": {json.dumps(document["source"])},\n "variables": [\n{rows}\n ]\n}}\n'
    )
    print(f"wrote {len(document['variables'])} variables to {FIXTURE}")


if __name__ == "__main__":
    main()
