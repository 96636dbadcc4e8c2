"""Seed-003: the elephant CNN case study, plain Keras against kerasjit, with a speedup report.

The case study timed `fit` with `%time`; here a JitProfiler on each run
records every epoch (compile overhead apart from steady state), and
`speedup_report` writes the comparison as one HTML page:

    python examples/elephant_cnn.py [--epochs 3] [--image-size 40] [--out elephant_cnn.html]

Synthetic images with a fixed seed stand in for the elephant photos. The case
study used 150x150 images; the default here is small so it runs in a minute.
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasjit  # noqa: E402  (first: TensorFlow loads without its routine log lines)
import keras  # noqa: E402

from kerasjit import workloads  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=40)
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--out", default="elephant_cnn.html")
    args = parser.parse_args()

    size = args.image_size
    x, y = workloads.classification_data(args.samples, (size, size, 3), 1)
    profilers = []
    for wrapped in (False, True):
        keras.utils.set_random_seed(0)               # both start from the same weights
        model = workloads.elephant_cnn(image_size=size)
        name = "plain Keras"
        if wrapped:
            model = kerasjit.wrap(model, backend=args.backend)
            name = f"kerasjit ({model._kerasjit.backend.name})"    # the backend "auto" chose
        profiler = kerasjit.JitProfiler(name=name, batch_size=64)
        model.fit(x, y, batch_size=64, epochs=args.epochs, verbose=0, callbacks=[profiler])
        profilers.append(profiler)
        columns = ["epoch", "epoch_seconds", "step_p50_ms", "peak_rss_mib", "loss"]
        print(name, profiler.dataframe[columns].to_string(index=False), sep="\n")
    print("report:", kerasjit.report.speedup_report(profilers, args.out,
                                                   title="Elephant CNN: plain Keras vs kerasjit"))


if __name__ == "__main__":
    main()
