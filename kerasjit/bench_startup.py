"""`python -m kerasjit.bench_startup`: how soon real CNNs train, kerasjit vs plain Keras and XLA.

Keras applications (ResNet50, MobileNetV2, EfficientNetB0, DenseNet121;
weights=None, 32x32x3 inputs, 10 classes, batch 8) train two epochs of
synthetic data, each contender in a process of its own, one after another:
plain Keras, Keras+XLA (`jit_compile=True`), kerasjit with an empty compile
cache (its compile runs in the background while TensorFlow runs the first
steps), then kerasjit again on that cache. Measured from the call of `fit`:
when the first step ended (what each traced and compiled before it: plain
Keras its graph, XLA its program, kerasjit on a warm cache its compiled
step), the first epoch's wall time, when the compiled step first ran
(kerasjit), and the median step of the second epoch (each contender's
steady state; for kerasjit the compiled step, waited for before the second
epoch if need be).
Writes reports/startup.csv and .md (--name: another file name).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = ("ResNet50", "MobileNetV2", "EfficientNetB0", "DenseNet121")
CONTENDERS = ("keras", "keras_xla", "kerasjit_cold", "kerasjit_warm")


def application(model_name, jit_compile=False):
    """Keras application `model_name`, untrained, for 32x32 RGB images of 10 classes, with
    Adam and sparse cross-entropy."""
    import keras
    model = getattr(keras.applications, model_name)(weights=None, input_shape=(32, 32, 3),
                                                    classes=10)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy",
                  jit_compile=jit_compile)
    return model


def application_data(n):
    """n random images and labels for `application`'s models."""
    import numpy as np
    rng = np.random.default_rng(0)
    return rng.random((n, 32, 32, 3), dtype=np.float32), rng.integers(0, 10, n)


def _contender(model_name, contender, steps, batch):
    """One contender's two epochs, in this process: a dict of its timings."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import kerasjit     # (first: TensorFlow loads without its routine log lines)
    import keras
    keras.utils.set_random_seed(0)
    model = application(model_name, jit_compile=contender == "keras_xla")
    x, y = application_data(steps * batch)
    if contender.startswith("kerasjit"):
        kerasjit.wrap(model, background=True)

    class Clock(keras.callbacks.Callback):
        kerasjit_batch_safe = True      # (reads no variables: kerasjit need not write them back)

        def __init__(self):
            super().__init__()
            self.ends, self.compiled_at, self.epoch_ends = [], None, []

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            self.ends.append(now)
            state = getattr(self.model, "_kerasjit", None)
            if self.compiled_at is None and state is not None and not state.train.compiling:
                self.compiled_at = now      # (adopted before this step ran: it ran compiled)

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_ends.append(time.perf_counter())
            state = getattr(self.model, "_kerasjit", None)
            if epoch == 0 and state is not None:
                state.train.wait()          # the second epoch measures the compiled step

    clock = Clock()
    start = time.perf_counter()
    model.fit(x, y, batch_size=batch, epochs=2, shuffle=False, verbose=0, callbacks=[clock])
    second = [b - a for a, b in zip(clock.ends[steps:], clock.ends[steps + 1:])]
    return {"first_step_s": clock.ends[0] - start, "first_epoch_s": clock.epoch_ends[0] - start,
            "compiled_after_s": None if clock.compiled_at is None else clock.compiled_at - start,
            "steady_ms_per_step": 1000 * statistics.median(second)}


def _run(model_name, contender, steps, batch, cache):
    env = dict(os.environ, KERASJIT_CACHE_DIR=cache, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-m", "kerasjit.bench_startup", "--one", model_name,
                           contender, str(steps), str(batch)], env=env, capture_output=True,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{model_name}/{contender} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(models, steps, batch):
    rows = []
    for name in models:
        with tempfile.TemporaryDirectory(prefix="kerasjit-startup-") as cache:
            results = {c: _run(name, c, steps, batch, cache) for c in CONTENDERS}
        base = results["keras"]
        for c, r in results.items():
            rows.append({"model": name, "contender": c, "batch": batch, "steps": steps, **r,
                         "first_epoch_vs_keras": r["first_epoch_s"] / base["first_epoch_s"],
                         "steady_speedup_vs_keras": base["steady_ms_per_step"]
                         / r["steady_ms_per_step"]})
            print(rows[-1], flush=True)
    return rows


def write_reports(rows, out_dir, command, name="startup"):
    import pandas as pd

    from kerasjit.bench import machine
    os.makedirs(out_dir, exist_ok=True)
    pd.DataFrame(rows).to_csv(os.path.join(out_dir, f"{name}.csv"), index=False,
                              float_format="%.6g")
    lines = ["# Time to train: kerasjit's start-up on real CNNs", "",
             f"Machine: {machine()}", "",
             command, "",
             __doc__.split("\n\n", 1)[1].strip(), "",
             "| model | contender | first step s | first epoch s | vs Keras "
             "| compiled step from s | steady ms/step | steady speedup |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        at = "" if r["compiled_after_s"] is None else f"{r['compiled_after_s']:.1f}"
        lines.append(f"| {r['model']} | {r['contender']} | {r['first_step_s']:.1f} | "
                     f"{r['first_epoch_s']:.1f} | "
                     f"{r['first_epoch_vs_keras']:.2f}x | {at} | "
                     f"{r['steady_ms_per_step']:.1f} | {r['steady_speedup_vs_keras']:.2f}x |")
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--one"]:       # (a contender's own process)
        name, contender, steps, batch = argv[1:5]
        print(json.dumps(_contender(name, contender, int(steps), int(batch))))
        return
    parser = argparse.ArgumentParser(prog="python -m kerasjit.bench_startup",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=list(MODELS), choices=MODELS)
    parser.add_argument("--steps", type=int, default=200, help="batches per epoch")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--out", default="reports")
    parser.add_argument("--name", default="startup",
                        help="report files: OUT/NAME.csv, .md")
    args = parser.parse_args(argv)
    rows = bench(args.models, args.steps, args.batch)
    from kerasjit.bench import command_line
    write_reports(rows, args.out, command_line("kerasjit.bench_startup", argv), args.name)


if __name__ == "__main__":
    main()
