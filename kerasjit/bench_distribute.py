"""`python -m kerasjit.bench_distribute`: data-parallel steps, kerasjit vs plain Keras, in one run.

The host's CPU is split into `--replicas` logical devices, and each model
(the seed MLP, the MNIST convnet; synthetic data) trains under
MirroredStrategy over them, plain Keras and kerasjit, and, for scale, on one
replica without a strategy, each contender its own copy: an epoch of `fit`
per round (shuffled, the global batch split over the replicas), contenders
interleaved round by round in this process, the first round (compiles)
dropped, the median of the others reported. Writes reports/distribute.csv
and .md.
"""
import argparse
import contextlib
import os
import statistics
import time

def _parser():
    parser = argparse.ArgumentParser(prog="python -m kerasjit.bench_distribute",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7, help="per contender, first is compile")
    parser.add_argument("--steps", type=int, default=80, help="batches per epoch (MLP; CNN: 1/4)")
    parser.add_argument("--models", nargs="*", help="subset of model names")
    parser.add_argument("--out", default="reports")
    return parser


if __name__ == "__main__":
    _parser().parse_args()     # --help and bad arguments: answered before TensorFlow loads

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasjit  # noqa: E402  (first: TensorFlow loads without its routine log lines)
import keras  # noqa: E402
import pandas as pd  # noqa: E402
import tensorflow as tf  # noqa: E402

from kerasjit import workloads  # noqa: E402
from kerasjit.bench import PAUSE_S, check_models, command_line, machine  # noqa: E402

CONTENDERS = ("keras", "kerasjit")


def _models(steps):
    return {"mlp_784_256_10": (workloads.mlp, (784,), 64, steps),
            "mnist_cnn": (workloads.mnist_cnn, (28, 28, 1), 128, max(2, steps // 4))}


def _build(contender, build, strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = build()
    return kerasjit.wrap(model, background=False) if contender == "kerasjit" else model


def bench(name, build, shape, batch, steps, strategy, rounds):
    x, y = workloads.classification_data(batch * steps, shape, 10)
    setups = {(replicas, c): _build(c, build, strategy if replicas > 1 else None)
              for replicas in (strategy.num_replicas_in_sync, 1) for c in CONTENDERS}
    times = {key: [] for key in setups}
    for r in range(rounds):
        for key, model in setups.items():
            time.sleep(PAUSE_S)
            start = time.perf_counter()
            model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
            times[key].append(time.perf_counter() - start)
        print(f"  {name} round {r + 1}/{rounds}: " + ", ".join(
            f"{c} x{n} {t[-1]:.3f}s" for (n, c), t in times.items()), flush=True)
    rows = []
    for (replicas, contender), t in times.items():
        median = statistics.median(t[1:])
        base = statistics.median(times[replicas, "keras"][1:])
        rows.append({"model": name, "replicas": replicas, "contender": contender,
                     "global_batch": batch, "steps": steps, "ms_per_step": 1000 * median / steps,
                     "speedup_vs_keras": base / median})
    return rows


def write_reports(rows, out_dir, command, replicas):
    os.makedirs(out_dir, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out_dir, "distribute.csv"), index=False, float_format="%.6g")
    lines = ["# kerasjit under tf.distribute", "",
             f"Machine: {machine()}; its CPU split into {replicas} logical devices", "",
             command, "",
             f"`MirroredStrategy` over the {replicas} devices (`replicas` = {replicas}) and, "
             "for scale, one replica without a strategy (`replicas` = 1); speed-up against "
             "plain Keras with as many replicas. Median epoch of `fit` after the first "
             "(compiles), contenders interleaved round by round in one process.", "",
             "| model | replicas | contender | global batch | ms/step | speedup vs Keras |",
             "|---|---:|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['replicas']} | {r['contender']} | {r['global_batch']} "
                     f"| {r['ms_per_step']:.2f} | {r['speedup_vs_keras']:.2f}x |")
    with open(os.path.join(out_dir, "distribute.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return table


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    check_models(parser, args.models, _models(args.steps))
    # Before TensorFlow sets up its devices: one CPU as `replicas` logical ones.
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration()] * args.replicas)
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(args.replicas)])
    rows = []
    for name, (build, shape, batch, steps) in _models(args.steps).items():
        if not args.models or name in args.models:
            rows += bench(name, build, shape, batch, steps, strategy, args.rounds)
    table = write_reports(rows, args.out, command_line("kerasjit.bench_distribute", argv or []),
                          args.replicas)
    print(table.to_string(index=False))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
