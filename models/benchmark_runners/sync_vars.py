"""Synchronous parameter_server steps without the step-end barrier (``--per_variable_sync``).

With ``--cross_replica_sync`` alone every worker applies its own gradients and then waits at
tf_cnn_benchmarks' barrier: no worker reads a variable of step N+1 before every worker has
finished all of step N, so a step's pulls cannot start before its last push is in. Here each
variable is released on its own instead:

* every trainable variable gets a ``ConditionalAccumulator`` on its PS; each worker puts its
  gradient there, stamped with its step (a gradient of another step is refused);
* the chief takes each variable's mean of all W gradients as soon as they are in, applies it
  with the optimizer (once per step: each update is the mean of every worker's gradient), and
  then puts a token into that variable's queue for each worker;
* a worker's read of a variable for its next step waits for its own token of that variable
  (a queue per variable and worker, so a fast worker can never take a slow one's token).

So the next step's reads of the variables whose gradients came first (the last layers') are
on the wire while the first layers' gradients still cross, and the forward pass starts as soon
as the first layer's value is back; no step-end queue. All of it lives on the PS: the tokens'
queues and the accumulators beside each variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import tensorflow as tf

from tflaunch.models.benchmark_runners.transfers import explicit_read, reroute

v1 = tf.compat.v1


@dataclass
class PerVariableSync:
    """The ops a worker runs: ``train_op`` (its gradients in; on the chief also every
    variable's take, apply and release), ``local_step`` (fed with the worker's step count),
    ``prime`` (the chief, once after initialisation: every worker's first tokens)."""

    train_op: tf.Operation
    local_step: tf.Tensor
    prime: tf.Operation | None


def _name(var) -> str:
    return var.handle.op.name


def per_variable_sync(
    variables: Sequence,
    grads: Sequence[tf.Tensor],
    reads: dict[int, list],
    optimizer: v1.train.Optimizer,
    num_workers: int,
    rank: int,
    extra_ops: Sequence = (),
) -> PerVariableSync:
    """Rebuild a worker's parameter_server step as above: ``reads`` are the model's reads of
    each variable (by index; rerouted to token-gated ones), ``grads`` its gradients; the chief
    is rank 0. ``extra_ops`` (batch norm's moving averages) run with every step."""
    local_step = v1.placeholder(tf.int64, [], name="sync_local_step")
    puts, releases, primes = [], [], []
    for i, (var, grad) in enumerate(zip(variables, grads, strict=True)):
        with v1.device(var.device):
            acc = v1.ConditionalAccumulator(
                grad.dtype.base_dtype,
                shape=var.shape,
                shared_name=f"sync_grads/{_name(var)}",
                reduction_type="MEAN",
            )
            tokens = [
                v1.FIFOQueue(
                    2, [tf.bool], shapes=[[]], shared_name=f"sync_release/{_name(var)}/{w}"
                )
                for w in range(num_workers)
            ]
            mine = tokens[rank].dequeue()
        value = explicit_read(var, i, [mine])
        reroute(reads.get(i, []), value)
        with v1.device(var.device):
            puts.append(acc.apply_grad(grad, local_step=local_step))
            if rank == 0:
                mean = acc.take_grad(num_workers)
                applied = optimizer.apply_gradients([(mean, var)])
                with tf.control_dependencies([applied]):
                    releases += [q.enqueue(tf.constant(True)) for q in tokens]
                primes += [q.enqueue(tf.constant(True)) for q in tokens]
    train_op = tf.group(*puts, *releases, *extra_ops, name="per_variable_sync_step")
    prime = tf.group(*primes, name="per_variable_sync_prime") if primes else None
    return PerVariableSync(train_op, local_step, prime)
