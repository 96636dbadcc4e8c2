"""Seed-002: softmax regression (784 -> 10, SGD 0.5, batch 100), trained through kerasjit.

Synthetic MNIST-shaped data with a fixed seed (no download):

    python examples/softmax_regression.py [--epochs 5] [--backend auto]
"""
import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasjit  # noqa: E402
from kerasjit import workloads  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()

    x, y = workloads.classification_data(12000, (784,), 10)
    (x_train, x_test), (y_train, y_test) = (x[:10000], x[10000:]), (y[:10000], y[10000:])
    model = kerasjit.wrap(workloads.softmax_regression(), backend=args.backend)
    model.fit(x_train, y_train, batch_size=100, epochs=args.epochs, verbose=2)
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=100, verbose=0)
    print(f"held-out loss {loss:.4f}, accuracy {accuracy:.3f}")
    print(kerasjit.explain(model, x_train[:100], y_train[:100]))


if __name__ == "__main__":
    main()
