"""A real TensorFlow task that reports how TensorFlow itself reads its TF_CONFIG.

Every task prints one line ``resolved: {...}`` with the ClusterSpec and task that
TFConfigClusterResolver returns and whether CUDA_VISIBLE_DEVICES is exported. A PS then serves
with tf.distribute.Server; a worker sleeps WORK_SECONDS (worker 0 returns at once) and exits 0.
"""

import json
import os
import time

import tensorflow as tf

resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
report = {
    "cluster": resolver.cluster_spec().as_dict(),
    "task_type": resolver.task_type,
    "task_id": resolver.task_id,
    "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "gpus_seen": len(tf.config.list_physical_devices("GPU")),
}
print("resolved: " + json.dumps(report), flush=True)
if resolver.task_type == "ps":
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name="ps",
        task_index=resolver.task_id,
        protocol="grpc",
        start=True,
    )
    server.join()
elif resolver.task_id != 0:
    time.sleep(float(os.environ.get("WORK_SECONDS", "0")))
