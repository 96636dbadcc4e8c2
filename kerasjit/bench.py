"""`python -m kerasjit.bench`: plain Keras vs Keras+XLA vs kerasjit, in one run.

Each contender trains its own copy of a model on the same synthetic data.
Epochs are interleaved (plain, XLA, kerasjit, plain, ...) so drift in the
machine's speed hits all alike; the first epoch of each contender holds its
tracing and compiling and is reported apart (compile = first epoch minus the
median epoch); speed is the median of the remaining epochs. Writes
reports/benchmark.csv and reports/benchmark.md.
"""
import argparse
import os
import platform
import statistics
import time
from datetime import datetime, timezone

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pandas as pd  # noqa: E402
import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasjit  # noqa: E402
from kerasjit import workloads  # noqa: E402


def _models(image_size):
    return {
        "softmax_regression": (workloads.softmax_regression, (784,), 10, 100),
        "mlp_784_256_10": (lambda jit_compile=False: workloads.mlp(0, jit_compile), (784,), 10, 64),
        f"elephant_cnn_{image_size}": (
            lambda jit_compile=False: workloads.elephant_cnn(image_size, jit_compile),
            (image_size, image_size, 3), 1, 64),
    }


CONTENDERS = ("keras", "keras_xla", "kerasjit")


def _make(contender, build):
    keras.utils.set_random_seed(0)
    model = build(jit_compile=(contender == "keras_xla"))
    return kerasjit.wrap(model) if contender == "kerasjit" else model


def bench_model(name, build, shape, classes, batch, steps, epochs):
    x, y = workloads.classification_data(steps * batch, shape, classes)
    models = {c: _make(c, build) for c in CONTENDERS}
    times = {c: [] for c in CONTENDERS}
    rss = {}
    process = psutil.Process()
    for epoch in range(epochs):
        for c, model in models.items():
            before = process.memory_info().rss
            start = time.perf_counter()
            model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
            times[c].append(time.perf_counter() - start)
            if epoch == 0:
                rss[c] = (process.memory_info().rss - before) / 2**20
        print(f"  {name} epoch {epoch + 1}/{epochs}: " +
              ", ".join(f"{c} {times[c][-1]:.3f}s" for c in CONTENDERS), flush=True)
    rows = []
    base = statistics.median(times["keras"][1:])
    for c in CONTENDERS:
        median = statistics.median(times[c][1:])
        rows.append({"model": name, "contender": c, "batch": batch, "steps_per_epoch": steps,
                     "median_epoch_s": median, "ms_per_step": 1000 * median / steps,
                     "compile_s": max(0.0, times[c][0] - median),
                     "speedup_vs_keras": base / median,
                     "first_epoch_rss_growth_mb": rss[c]})
    return rows


def machine():
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from kerasjit.backends.cpu.engine import host_cpu_name
    return (f"{cpu} ({host_cpu_name()}), {psutil.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB; "
            f"TensorFlow {tf.__version__}, Keras {keras.__version__}, kerasjit "
            f"{kerasjit.__version__}")


def write_reports(rows, out_dir, command):
    os.makedirs(out_dir, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out_dir, "benchmark.csv"), index=False, float_format="%.6g")
    lines = ["# kerasjit benchmark", "",
             f"Machine: {machine()}", "",
             f"Command: `{command}` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             "Median epoch time after the first (compile) epoch; contenders interleaved "
             "epoch by epoch in one process. `compile_s` = first epoch minus median epoch.", "",
             "| model | contender | ms/step | speedup vs Keras | compile s | first-epoch RSS growth MB |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['contender']} | {r['ms_per_step']:.2f} | "
                     f"{r['speedup_vs_keras']:.2f}x | {r['compile_s']:.2f} | "
                     f"{r['first_epoch_rss_growth_mb']:.0f} |")
    with open(os.path.join(out_dir, "benchmark.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return table


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="per contender, first is compile")
    parser.add_argument("--steps", type=int, default=20, help="steps per epoch (small models)")
    parser.add_argument("--cnn-steps", type=int, default=3, help="steps per epoch (elephant CNN)")
    parser.add_argument("--image-size", type=int, default=150)
    parser.add_argument("--models", nargs="*", help="subset of model names")
    parser.add_argument("--out", default="reports")
    args = parser.parse_args(argv)
    rows = []
    for name, (build, shape, classes, batch) in _models(args.image_size).items():
        if args.models and name not in args.models:
            continue
        steps = args.cnn_steps if name.startswith("elephant") else args.steps
        rows += bench_model(name, build, shape, classes, batch, steps, args.epochs)
    table = write_reports(rows, args.out, "python -m kerasjit.bench " + " ".join(argv or []))
    print(table.to_string(index=False))


if __name__ == "__main__":
    import sys
    main(sys.argv[1:])
