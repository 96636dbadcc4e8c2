"""`python -m kerasjit`: train the seed workloads plain and wrapped, side by side.

Synthetic data with a fixed seed (no network needed). For each model it
prints the training logs of plain Keras and of `kerasjit.wrap`, how far apart
the final weights are, and what kerasjit compiled and left to TensorFlow.
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import kerasjit  # noqa: E402
from kerasjit import workloads  # noqa: E402


def run(name, build, x, y, batch, epochs, backend):
    results = {}
    for mode in ("plain", "kerasjit"):
        keras.utils.set_random_seed(0)
        model = build()
        if mode == "kerasjit":
            model = kerasjit.wrap(model, backend=backend)
        start = time.perf_counter()
        history = model.fit(x, y, batch_size=batch, epochs=epochs, shuffle=False, verbose=0)
        seconds = time.perf_counter() - start
        results[mode] = model
        logs = ", ".join(f"{k}={v[-1]:.4f}" for k, v in history.history.items())
        print(f"{name:>20} {mode:>8}: {logs}  ({seconds:.1f} s incl. tracing/compiling)")
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(results["plain"].get_weights(), results["kerasjit"].get_weights()))
    print(f"{name:>20}   max |weight difference| after training: {diff:.2e}")
    print(kerasjit.explain(results["kerasjit"], x[:batch], y[:batch]))
    print()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--image-size", type=int, default=40,
                        help="elephant CNN input size (the case study uses 150)")
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args(argv)

    x, y = workloads.classification_data(args.samples, (784,), 10)
    run("softmax_regression", workloads.softmax_regression, x, y, 100, args.epochs, args.backend)
    size = args.image_size
    x, y = workloads.classification_data(args.samples // 4, (size, size, 3), 1)
    run("elephant_cnn", lambda: workloads.elephant_cnn(image_size=size), x, y, 16,
        args.epochs, args.backend)


if __name__ == "__main__":
    main()
