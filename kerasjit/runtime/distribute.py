"""Steps under a tf.distribute strategy: every replica's step in one trace.

Keras runs a step under a strategy as `strategy.run(step, (batch,))` and
reduces the replicas' outputs. kerasjit traces exactly that function, with
each replica's part of the batch as arguments of its own, so one trace holds
the replicas' steps, the strategy's cross-replica reduction of gradients and
the updates of every copy of a mirrored variable. Within one process every
member of the all-reduce is in that trace, and it compiles as arithmetic
with the rest (frontend/collectives.py); across workers the collective ops
run in TensorFlow, a cluster between compiled ones.
"""
import tensorflow as tf
from keras.src import tree
from keras.src.backend.tensorflow.trainer import reduce_per_replica

# Strategies whose step is Keras's `strategy.run` on every local replica, in
# one process per worker: what `replicated` traces. (ParameterServerStrategy
# ships steps to remote workers through a coordinator; TPUStrategy compiles
# for TPUs itself.)
_SUPPORTED = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy,
              tf.distribute.OneDeviceStrategy, tf.distribute.experimental.CentralStorageStrategy)


def strategy_of(model):
    """The strategy a model was built under (in its scope), or None."""
    return getattr(model, "_distribute_strategy", None)


def check_strategy(strategy):
    """A clear error for a strategy whose steps kerasjit cannot run (None: none)."""
    if strategy is not None and not isinstance(strategy, _SUPPORTED):
        raise NotImplementedError(
            f"kerasjit.wrap does not support {type(strategy).__name__}: train this model "
            "without kerasjit.wrap (kerasjit runs MirroredStrategy, "
            "MultiWorkerMirroredStrategy, OneDeviceStrategy and CentralStorageStrategy)")


class Replicas(tuple):
    """A batch split over the local replicas already: one part per replica."""


def local_batches(batch, strategy):
    """A step's arguments for one of Keras's batches: one batch per local
    replica (the parts of a batch split already, a distributed dataset's
    per-replica values, or the whole batch for each: train_on_batch's, as
    Keras gives it to every replica); without a strategy, the batch."""
    if strategy is None:
        return (batch,)
    if isinstance(batch, Replicas):
        return tuple(batch)
    count = _local_replicas(strategy)
    parts = [strategy.experimental_local_results(leaf) for leaf in tf.nest.flatten(batch)]
    return tuple(tf.nest.pack_sequence_as(batch, [p[i] if len(p) == count else p[0]
                                                  for p in parts])
                 for i in range(count))


def split_batch(batch, strategy):
    """A global batch split over the replicas as a distributed dataset splits
    it (ceil(rows / replicas) rows each while rows last): the parts of this
    worker's replicas; without a strategy, the batch."""
    if strategy is None:
        return (batch,)
    leaves = tf.nest.flatten(batch)
    rows = len(leaves[0])
    chunk = -(-rows // strategy.num_replicas_in_sync)
    return Replicas(tf.nest.pack_sequence_as(batch, [leaf[i * chunk:(i + 1) * chunk]
                                                     for leaf in leaves])
                    for i in range(_local_replicas(strategy)))


def replicated(step, strategy, reduction):
    """`step` as Keras runs it under `strategy`, taking one batch per local
    replica and returning the replicas' outputs reduced as Keras does
    (without a strategy, `step` itself)."""
    if strategy is None:
        return step

    def function(*batches):
        parts = iter(batches)     # (asked for in the order of the local replicas)
        data = strategy.experimental_distribute_values_from_function(lambda _: next(parts))
        return _reduced(strategy.run(step, args=(data,)), strategy, reduction)
    function.__name__ = getattr(step, "__name__", "step")
    return function


def _local_replicas(strategy):
    return len(strategy.extended.worker_devices)


def multi_worker(strategy):
    return strategy.extended._in_multi_worker_mode()


def _reduced(outputs, strategy, reduction):
    """The replicas' outputs reduced as Keras's reduce_per_replica does, except
    that across workers a mean is elementwise, as it is within one (Keras
    3's asks for axis 0, which fails on its scalar logs)."""
    if reduction == "auto" and multi_worker(strategy):
        return tree.map_structure(lambda v: strategy.reduce("MEAN", v, axis=None), outputs)
    return reduce_per_replica(outputs, strategy, reduction)


def symbolic_build(model):
    """Keras's `_maybe_symbolic_build` for a wrapped model under a strategy:
    the batch that builds it is the first replica's part (Keras 3 reduces a
    distributed batch across the replicas, a structure a multi-worker strategy
    cannot reduce: fit fails before its first step)."""
    def build(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = local_batches(next(batches), model._distribute_strategy)[0]
                break
        with model._distribute_strategy.scope():
            model._symbolic_build(data_batch=data_batch)
    return build
