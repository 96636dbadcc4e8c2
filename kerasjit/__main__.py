"""`python -m kerasjit`: train the seed workloads plain and wrapped, and write a speedup report.

The seed-002 softmax regression and the seed-003 elephant CNN each train as
plain Keras and as `kerasjit.wrap(model, backend=...)`, from the same initial
weights on the same synthetic data (fixed seed, no network needed), with a
JitProfiler on each. The two contenders alternate epoch by epoch, so drift
in the machine's speed hits both alike. The HTML report shows whatever was
measured (compile overhead included), how far apart the trained weights
are, and what kerasjit compiled and left to TensorFlow.
"""
import argparse
import os
import time

import kerasjit


def compare(title, build, x, y, batch, epochs, backend):
    """Train build() plain and wrapped; returns (profilers, weight-difference note, explanation)."""
    import keras
    import numpy as np

    from kerasjit.callbacks import JitProfiler
    contenders = {}
    for wrapped in (False, True):
        keras.utils.set_random_seed(0)
        model = build()
        label = "plain Keras"
        if wrapped:
            model = kerasjit.wrap(model, backend=backend)
            label = f"kerasjit ({model._kerasjit.backend.name})"
        contenders[label] = model, JitProfiler(name=label, batch_size=batch)
    for epoch in range(epochs):
        for label, (model, profiler) in contenders.items():
            model.fit(x, y, batch_size=batch, initial_epoch=epoch, epochs=epoch + 1,
                      shuffle=False, verbose=0, callbacks=[profiler])
            row = profiler.rows[-1]
            print(f"{title:>18} | {label:<20} epoch {epoch + 1}/{epochs}: "
                  f"{row['epoch_seconds']:7.2f} s  loss {row['loss']:.4f}", flush=True)
    (plain, _), (jitted, _) = contenders.values()
    diff = max(float(np.max(np.abs(a - b)))
               for a, b in zip(plain.get_weights(), jitted.get_weights()))
    note = f"max |weight difference| plain Keras vs kerasjit after {epochs} epoch(s): {diff:.2e}"
    print(f"{title:>18} | {note}")
    explanation = kerasjit.explain(jitted, x[:batch], y[:batch])
    print(explanation, end="\n\n")
    return [profiler for _, profiler in contenders.values()], note, explanation


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m kerasjit",
                                     description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per run (default 3: the first carries tracing/compiling)")
    parser.add_argument("--image-size", type=int, default=40,
                        help="elephant CNN input size, at least 40 (the case study uses 150)")
    parser.add_argument("--samples", type=int, default=None,
                        help="training samples per model (default: 10000 for the softmax "
                             "regression, 512 for the far costlier elephant CNN)")
    parser.add_argument("--backend", default="auto", help="kerasjit backend (default auto)")
    parser.add_argument("--out", default="reports/speedup.html", help="report path")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    # (TensorFlow loads here, after the arguments: --help answers at once)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    from kerasjit import workloads
    from kerasjit.callbacks import speedup_report

    size = args.image_size
    seeds = {  # title: (model, input shape, classes, batch size as in the seed, default samples)
        "softmax_regression": (workloads.softmax_regression, (784,), 10, 100, 10000),
        "elephant_cnn": (lambda: workloads.elephant_cnn(image_size=size), (size, size, 3), 1, 64,
                         512),
    }
    runs, notes, explanations, setup = {}, {}, {}, []
    for title, (build, shape, classes, batch, samples) in seeds.items():
        x, y = workloads.classification_data(args.samples or samples, shape, classes)
        setup.append(f"{title} {len(x)} samples of {'x'.join(map(str, shape))}, batch {batch}")
        runs[title], notes[title], explained = compare(title, build, x, y, batch, args.epochs,
                                                       args.backend)
        explanations[f"{title}: {runs[title][1].name}"] = explained
    notes["setup"] = (f"synthetic data (seed 0): {'; '.join(setup)}; {args.epochs} epoch(s); "
                      f"kerasjit backend '{args.backend}'. Plain and wrapped models start from "
                      "the same weights and alternate epoch by epoch in one process, so RSS "
                      "figures include each other's memory.")
    path = speedup_report(runs, args.out, title="kerasjit vs plain Keras: the seed workloads",
                          explanations=explanations, notes=notes)
    print(f"report: {path}  ({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    main()
