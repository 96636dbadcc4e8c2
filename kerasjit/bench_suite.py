"""The benchmark's workloads and how a contender's calls are timed.

Shared by `python -m kerasjit.bench` (TensorFlow's Keras) and its Keras-on-JAX
peer process (`kerasjit.bench_peer`), so both time the same models on the same
data the same way. Imports no TensorFlow: the peer must not load it.
"""
import time
from dataclasses import dataclass

import keras
import psutil

from kerasjit import workloads

STEPS_PER_EXECUTION = 50


@dataclass
class Workload:
    build: object           # build(jit_compile) -> compiled Keras model
    data: object            # data(n) -> (x, y) of n samples
    batch: int
    steps: int              # batches per epoch
    modes: tuple            # of "fit", "fit_spe", "evaluate", "predict", "train_on_batch"


def _images(shape, classes):
    return lambda n: workloads.classification_data(n, shape, classes)


def suite(args):
    """The benchmark's workloads by name, sized by its parsed arguments."""
    everything = ("fit", "fit_spe", "evaluate", "predict", "train_on_batch")
    return {
        "softmax_regression": Workload(workloads.softmax_regression, _images((784,), 10), 100,
                                       args.softmax_steps, everything),
        "mlp_784_256_10": Workload(lambda jit_compile=False: workloads.mlp(0, jit_compile),
                                   _images((784,), 10), 64, args.steps,
                                   ("fit", "evaluate", "predict", "train_on_batch")),
        "mnist_cnn": Workload(workloads.mnist_cnn, _images((28, 28, 1), 10), 128,
                              args.mnist_steps, ("fit", "evaluate", "predict", "train_on_batch")),
        "text_cnn": Workload(workloads.text_cnn, lambda n: workloads.token_data(n, 40, 1000), 64,
                             args.steps, ("fit", "evaluate", "predict")),
        "text_transformer": Workload(workloads.text_transformer,
                                     lambda n: workloads.token_data(n, 40, 1000), 64, args.steps,
                                     ("fit", "evaluate", "predict")),
        "text_lstm": Workload(lambda jit_compile=False: workloads.text_rnn(
            "LSTM", jit_compile=jit_compile), lambda n: workloads.token_data(n, 40, 1000), 64,
            args.steps, ("fit", "evaluate", "predict")),
        "text_gru": Workload(lambda jit_compile=False: workloads.text_rnn(
            "GRU", jit_compile=jit_compile), lambda n: workloads.token_data(n, 40, 1000), 64,
            args.steps, ("fit",)),
        "mnist_cnn_mixed_f16": Workload(workloads.under_policy("mixed_float16",
                                                               workloads.mnist_cnn),
                                        _images((28, 28, 1), 10), 128, args.mnist_steps,
                                        ("fit",)),
        "gpt_decoder": Workload(workloads.gpt_decoder,
                                lambda n: workloads.next_token_data(n, 40, 1000), 16, args.steps,
                                ("fit",)),
        "pooling_cnn": Workload(workloads.pooling_cnn, _images((32, 32, 3), 10), 64,
                                args.steps, ("fit",)),
        "convnext_block": Workload(workloads.convnext_block, _images((32, 32, 3), 10), 64,
                                   args.steps, ("fit",)),
        "small_resnet": Workload(workloads.small_resnet, _images((32, 32, 3), 10), 64,
                                 args.mnist_steps, ("fit",)),
        "mini_unet": Workload(workloads.mini_unet, workloads.mask_data, 32, args.mnist_steps,
                              ("fit",)),
        "dcgan_generator": Workload(workloads.dcgan_generator, workloads.latent_image_data, 32,
                                    args.mnist_steps, ("fit",)),
        f"elephant_cnn_{args.image_size}": Workload(
            lambda jit_compile=False: workloads.elephant_cnn(args.image_size, jit_compile),
            _images((args.image_size, args.image_size, 3), 1), 64, args.cnn_steps, ("fit",)),
    }


def build_model(build, jit_compile, steps_per_execution=1):
    """A workload's model, built from the same seed for every contender."""
    keras.utils.set_random_seed(0)
    model = build(jit_compile=jit_compile)
    model.steps_per_execution = steps_per_execution     # read when Keras builds its loop
    return model


def runner(mode, model, x, y, batch):
    """What one timed round of `mode` runs."""
    if mode in ("fit", "fit_spe"):
        return lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    if mode == "evaluate":
        return lambda: model.evaluate(x, y, batch_size=batch, verbose=0)
    if mode == "train_on_batch":      # a custom training loop: a call per batch
        starts = range(0, len(x), batch)
        return lambda: [model.train_on_batch(x[i:i + batch], y[i:i + batch]) for i in starts]
    return lambda: model.predict(x, batch_size=batch, verbose=0)


def steps_per_execution_for(mode):
    return STEPS_PER_EXECUTION if mode == "fit_spe" else 1


def short_call_samples(work, mode):
    """The compile-time measurement's call: a few batches (an epoch's own
    variation would swamp a compile), or one execution of `fit_spe`; the same
    batch shapes as the timed rounds, which then run compiled code."""
    return work.batch * max(2, steps_per_execution_for(mode))


def timed(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


class Contender:
    """One contender's models of a workload (`make(steps_per_execution)` builds
    one): a mode's compile-time measurement and its timed rounds."""

    def __init__(self, work, x, y, make):
        plain = make(1)
        spe = make(STEPS_PER_EXECUTION) if "fit_spe" in work.modes else None
        self._rounds, self._short_calls = {}, {}
        for mode in work.modes:
            model = spe if mode == "fit_spe" else plain
            short = short_call_samples(work, mode)
            self._rounds[mode] = runner(mode, model, x, y, work.batch)
            self._short_calls[mode] = runner(mode, model, x[:short], y[:short], work.batch)

    def first_calls(self, mode):
        """The model's first short call of `mode` (s), the fastest of its next
        three (s), and the process's RSS growth over the first (MB)."""
        process = psutil.Process()
        before = process.memory_info().rss
        first = timed(self._short_calls[mode])
        growth = (process.memory_info().rss - before) / 2**20
        return first, min(timed(self._short_calls[mode]) for _ in range(3)), growth

    def round(self, mode):
        """One timed round of `mode` (s)."""
        return timed(self._rounds[mode])
