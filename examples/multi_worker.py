"""Data-parallel training over several processes (MultiWorkerMirroredStrategy), through kerasjit.

Each worker compiles its replica's step; the gradients are all-reduced by
TensorFlow's collective ops between the compiled parts (see the README's
"Distributed training"). Synthetic data with a fixed seed (no download).

On this machine, two workers on localhost ports, started for you:

    python examples/multi_worker.py [--model mlp|cnn] [--epochs 3]

On real hosts, the same command on each, with every worker's address and
its own index (worker 0 is the chief, which prints the summary):

    python examples/multi_worker.py --hosts host1:12345,host2:12345 --index 0
    python examples/multi_worker.py --hosts host1:12345,host2:12345 --index 1
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasjit  # noqa: E402  (first: TensorFlow loads without its routine log lines)
import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from kerasjit import workloads  # noqa: E402

GLOBAL_BATCH = 64


def data(model):
    return workloads.classification_data(1024, (784,) if model == "mlp" else (28, 28, 1), 10)


def build(model):
    """The seed MLP or the MNIST convnet, without dropout: the replicas' masks
    would differ from one process's, and the result is compared with one."""
    return workloads.mlp(dropout=0.0) if model == "mlp" else workloads.mnist_cnn(dropout=0.0)


def worker(args):
    """One worker: its part of every global batch, the strategy's all-reduce."""
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": args.hosts.split(",")},
                                          "task": {"type": "worker", "index": args.index}})
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    keras.utils.set_random_seed(1)
    with strategy.scope():
        model = kerasjit.wrap(build(args.model))
    x, y = data(args.model)
    callbacks = []
    if args.backup:
        callbacks.append(keras.callbacks.BackupAndRestore(
            os.path.join(args.backup, f"worker{args.index}"), save_freq=args.save_freq))
    if args.exit_at is not None and args.index == 1:
        callbacks.append(_ExitAt(*args.exit_at))
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=args.epochs, shuffle=False,
                        callbacks=callbacks, verbose=2 if args.index == 0 else 0)
    if args.out:
        np.savez(os.path.join(args.out, f"worker{args.index}.npz"), *model.get_weights(),
                 loss=np.array(history.history["loss"]))
    if args.index == 0:
        print(f"{strategy.num_replicas_in_sync} replicas in sync")
        print(kerasjit.explain(model, x[:GLOBAL_BATCH], y[:GLOBAL_BATCH]))


class _ExitAt(keras.callbacks.Callback):
    """Ends the worker abruptly at (epoch, batch), as a lost machine would."""

    def __init__(self, epoch, batch):
        super().__init__()
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os._exit(3)


def _free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def local_cluster(argv, workers=2):
    """Start `workers` workers of this script on localhost; their exit codes.
    When one fails the others are stopped, as a cluster manager would before
    restarting them all (the collectives of the others cannot complete)."""
    hosts = ",".join(f"localhost:{p}" for p in _free_ports(workers))
    processes = [subprocess.Popen([sys.executable, __file__, *argv, "--hosts", hosts,
                                   "--index", str(i)]) for i in range(workers)]
    while any(p.poll() is None for p in processes):
        if any(p.poll() for p in processes):
            for p in processes:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.2)
    return [p.returncode for p in processes]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--hosts", help="host:port of every worker, comma-separated")
    parser.add_argument("--index", type=int, help="this worker's index in --hosts")
    parser.add_argument("--out", help="folder for each worker's weights and losses")
    parser.add_argument("--backup", help="folder for keras.callbacks.BackupAndRestore")
    parser.add_argument("--save-freq", default="epoch",
                        type=lambda s: s if s == "epoch" else int(s))
    parser.add_argument("--exit-at", type=lambda s: tuple(map(int, s.split(":"))),
                        metavar="EPOCH:BATCH", help="worker 1 dies there (a lost machine)")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    if args.index is not None:
        return worker(args)
    codes = local_cluster(argv)
    if any(codes):
        sys.exit(f"workers exited with {codes}")


if __name__ == "__main__":
    main()
