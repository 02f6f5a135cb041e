"""What runs on the cluster: programs, the networks they train, their data, and a small library for
users' own programs. With tracing's profiler and capture (:mod:`tflaunch.trace`), the only part of
tflaunch that imports TensorFlow, and only when a program runs (``smoke``, ``registry`` and
``cluster`` need none).

Programs (run as ``python -m tflaunch.models.<name>``; each task of a cluster runs one):

- ``smoke``: a cluster program without TensorFlow, to try tflaunch, a backend or a plugin;
- ``mnist``: the distributed MNIST case study (TF1 between-graph replication on PS);
- ``pss``: digit classification with TF2's ParameterServerStrategy, checkpointed and resumable;
- ``benchmark``: tf_cnn_benchmarks-style CNN throughput; its runners are
  ``benchmark_runners.graph`` (TF1 graph mode) and ``benchmark_runners.eager`` (``tf.function``,
  MultiWorkerMirroredStrategy), over the pieces they share in ``benchmark_runners.common`` (and
  ``benchmark_runners.transfers``, what crosses the links);
- ``tfrecords``: writes a small ImageNet-layout TFRecord set for the benchmark;
- ``netbench``: TensorFlow's gRPC runtime measured between the cluster's hosts (``tflaunch
  netbench``); ``tune_probe``: ``tflaunch tune``'s calibration probe, run in place of a program.

Below them:

- ``nets/``: the networks (``inception``, ``resnet`` on the ``layers`` library, ``deep_mnist``);
- ``registry``: the networks by name (tf_cnn_benchmarks' names, older ones as aliases), for the
  benchmark, ``tflaunch placement`` and ``tflaunch bench``; no TensorFlow at import;
- ``data/``: ``digits`` (MNIST files or scikit-learn's digits) and ``imagenet`` (TFRecords);
- ``cluster``: every program's cluster and task, from TF1 flags, a cluster file or TF_CONFIG; no
  TensorFlow. ``cluster_file_resolver``: the cluster file as a TF ClusterResolver for TF2
  strategies, and ``resolver_for`` (a resolver for a cluster from any source);
- ``placement`` (on TensorFlow graphs) and ``placement_math`` (the arithmetic): variable
  placement across PS tasks, for any TF1-style program.
- ``program``: what ``mnist`` and ``pss`` share: their usage error, positive-number flags and
  the one line a failed task prints before its exit code; no TensorFlow.

Nothing here imports tflaunch's core or its launchers: programs learn their cluster from their
arguments and environment only. The benchmark alone imports tracing's program side
(:mod:`tflaunch.trace.profiler`, :mod:`tflaunch.trace.transfers`) to take its own trace; and
``warning_signals`` keeps Slurm's warning signals from killing a program.
"""
