"""`python -m kerasjit.bench`: plain Keras vs Keras+XLA vs kerasjit, in one run.

Each contender trains its own copy of a model on the same synthetic data, in
interleaved rounds so drift in the machine's speed hits all alike. Timed: an
epoch of `fit` (shuffled; also with steps_per_execution), `evaluate` and
`predict`; speed is the median round after the first. Compile time is a
model's first short call minus its next ones (cache empty, then from the
cache for kerasjit). Writes reports/benchmark.csv and .md (--name changes the
stem; --backend picks kerasjit's backend, e.g. gpu).
"""
import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone

def _parser():
    parser = argparse.ArgumentParser(prog="python -m kerasjit.bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="per contender, first is compile")
    parser.add_argument("--softmax-steps", type=int, default=600,
                        help="batches per epoch, softmax regression (600: MNIST's 60000)")
    parser.add_argument("--steps", type=int, default=50,
                        help="batches per epoch, MLP and text CNN")
    parser.add_argument("--mnist-steps", type=int, default=20,
                        help="batches per epoch, MNIST CNN")
    parser.add_argument("--cnn-steps", type=int, default=3, help="batches per epoch, elephant CNN")
    parser.add_argument("--image-size", type=int, default=150)
    parser.add_argument("--models", nargs="*", help="subset of model names")
    parser.add_argument("--backend", default="auto", help="kerasjit's backend (auto, cpu, gpu)")
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="run N busy-loop processes beside the benchmark (a busy machine)")
    parser.add_argument("--out", default="reports")
    parser.add_argument("--name", default="benchmark", help="report files: OUT/NAME.csv, .md")
    return parser


if __name__ == "__main__":
    _parser().parse_args()     # --help and bad arguments: answered before TensorFlow loads

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import kerasjit  # noqa: E402  (first: TensorFlow loads without its routine log lines)
import keras  # noqa: E402
import pandas as pd  # noqa: E402
import psutil  # noqa: E402
import tensorflow as tf  # noqa: E402

from kerasjit import workloads  # noqa: E402
from kerasjit.backends import get_backend  # noqa: E402

CONTENDERS = ("keras", "keras_xla", "kerasjit")
STEPS_PER_EXECUTION = 50
# Before each timed call: the worker threads the previous call woke (TensorFlow's,
# XLA's and OpenBLAS's pools spin a while before sleeping) must not steal the
# cores from the next contender, as they would not in a process of its own.
PAUSE_S = 0.5


@dataclass
class Workload:
    build: object           # build(jit_compile) -> compiled Keras model
    data: object            # data(n) -> (x, y) of n samples
    batch: int
    steps: int              # batches per epoch
    modes: tuple            # of "fit", "fit_spe", "evaluate", "predict"


def _images(shape, classes):
    return lambda n: workloads.classification_data(n, shape, classes)


def _workloads(args):
    everything = ("fit", "fit_spe", "evaluate", "predict")
    return {
        "softmax_regression": Workload(workloads.softmax_regression, _images((784,), 10), 100,
                                       args.softmax_steps, everything),
        "mlp_784_256_10": Workload(lambda jit_compile=False: workloads.mlp(0, jit_compile),
                                   _images((784,), 10), 64, args.steps,
                                   ("fit", "evaluate", "predict")),
        "mnist_cnn": Workload(workloads.mnist_cnn, _images((28, 28, 1), 10), 128,
                              args.mnist_steps, ("fit", "evaluate", "predict")),
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
        f"elephant_cnn_{args.image_size}": Workload(
            lambda jit_compile=False: workloads.elephant_cnn(args.image_size, jit_compile),
            _images((args.image_size, args.image_size, 3), 1), 64, args.cnn_steps, ("fit",)),
    }


def _make(contender, build, backend, steps_per_execution=1):
    keras.utils.set_random_seed(0)
    model = build(jit_compile=(contender == "keras_xla"))
    model.steps_per_execution = steps_per_execution   # read when Keras builds its loop
    return kerasjit.wrap(model, backend=backend, background=False) if contender == "kerasjit" \
        else model


def _runner(mode, model, x, y, batch):
    """What one timed round of `mode` runs."""
    if mode in ("fit", "fit_spe"):
        return lambda: model.fit(x, y, batch_size=batch, epochs=1, verbose=0)
    if mode == "evaluate":
        return lambda: model.evaluate(x, y, batch_size=batch, verbose=0)
    return lambda: model.predict(x, batch_size=batch, verbose=0)


def _steps_per_execution(mode):
    return STEPS_PER_EXECUTION if mode == "fit_spe" else 1


def _timed(run):
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def bench_model(name, work, rounds, backend="auto"):
    x, y = work.data(work.steps * work.batch)
    models = {c: _make(c, work.build, backend) for c in CONTENDERS}
    spe_models = {c: _make(c, work.build, backend, STEPS_PER_EXECUTION) for c in CONTENDERS} \
        if "fit_spe" in work.modes else {}

    def model(mode, c):
        return (spe_models if mode == "fit_spe" else models)[c]

    # Compile time: each model's first call minus its next ones, on a call of
    # a few batches (an epoch's own variation would swamp it); the same batch
    # shapes as the timed rounds, which then run compiled code.
    short = {mode: work.batch * max(2, _steps_per_execution(mode)) for mode in work.modes}
    first, again = {}, {}
    process = psutil.Process()
    rss = {}
    for mode in work.modes:
        for c in CONTENDERS:
            run = _runner(mode, model(mode, c), x[:short[mode]], y[:short[mode]], work.batch)
            time.sleep(PAUSE_S)
            before = process.memory_info().rss
            first[mode, c] = _timed(run)
            rss[mode, c] = (process.memory_info().rss - before) / 2**20
            again[mode, c] = min(_timed(run) for _ in range(3))
    runs = {(mode, c): _runner(mode, model(mode, c), x, y, work.batch)
            for mode in work.modes for c in CONTENDERS}
    times = {key: [] for key in runs}
    for r in range(rounds):
        for (mode, c), run in runs.items():
            time.sleep(PAUSE_S)
            times[mode, c].append(_timed(run))
        print(f"  {name} round {r + 1}/{rounds}: " + ", ".join(
            f"{mode}/{c} {t[-1]:.3f}s" for (mode, c), t in times.items()), flush=True)
    # kerasjit's compile again, for a new copy of the model: its native code now comes
    # from the compile cache, as on every run after a model's first.
    cached = {}
    for mode in work.modes:
        fresh = _make("kerasjit", work.build, backend, _steps_per_execution(mode))
        cached[mode] = _timed(_runner(mode, fresh, x[:short[mode]], y[:short[mode]],
                                      work.batch)) - again[mode, "kerasjit"]
    rows = []
    for mode in work.modes:
        base = statistics.median(times[mode, "keras"][1:])
        for c in CONTENDERS:
            median = statistics.median(times[mode, c][1:])
            rows.append({"model": name, "mode": mode, "contender": c, "batch": work.batch,
                         "steps": work.steps,
                         "steps_per_execution": _steps_per_execution(mode),
                         "median_s": median, "ms_per_step": 1000 * median / work.steps,
                         "compile_s": max(0.0, first[mode, c] - again[mode, c]),
                         "compile_cached_s": max(0.0, cached[mode]) if c == "kerasjit"
                         else float("nan"),
                         "speedup_vs_keras": base / median,
                         "first_call_rss_growth_mb": rss[mode, c]})
    return rows


def machine(backend="auto"):
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    from kerasjit.backends.cpu.engine import host_cpu_name, host_isa
    chosen = get_backend(backend)
    gpus = len(tf.config.list_physical_devices("GPU"))
    isa, onednn_default = host_isa()
    flag = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    onednn = (f"oneDNN {'off' if flag in ('0', 'false', 'False') else 'on'} "
              f"(TF_ENABLE_ONEDNN_OPTS={flag})" if flag is not None else
              f"oneDNN {'on' if onednn_default else 'off'} (TensorFlow's default here)")
    return (f"{cpu} ({host_cpu_name()}, {isa}; {onednn}), {psutil.cpu_count()} cores, "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB; "
            f"TensorFlow {tf.__version__} ({gpus} GPU(s) visible to it), Keras "
            f"{keras.__version__}, kerasjit {kerasjit.__version__} on its "
            f"{chosen.name} backend" + (f" ({chosen.device})" if chosen.name == "gpu" else ""))


def busy_loops(n):
    """`n` processes that keep a core each busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def write_reports(rows, out_dir, command, name="benchmark", backend="auto", busy=0):
    os.makedirs(out_dir, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out_dir, f"{name}.csv"), index=False, float_format="%.6g")
    beside = f"; {busy} busy-loop process(es) ran beside the benchmark" if busy else ""
    lines = ["# kerasjit benchmark", "",
             f"Machine: {machine(backend)}{beside}", "",
             f"Command: `{command}` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             "Median round after the first; contenders interleaved round by round in one "
             "process. A round is one call: an epoch of `fit` with default arguments "
             "(shuffled), the same with `steps_per_execution` (`fit_spe`), `evaluate` or "
             "`predict` over the same data. `compile s`, measured before the rounds on calls "
             "of a few batches (2, or one execution of `fit_spe`): a model's first call "
             "minus its next ones, with kerasjit's compile cache empty; `cached` = the same "
             "for a new copy of the model afterwards, its native code from the cache (as on "
             "every run after a model's first). RSS growth: over that first call.", "",
             "| model | mode | contender | ms/step | speedup vs Keras | compile s "
             "| cached | first-call RSS growth MB |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['mode']} | {r['contender']} | {r['ms_per_step']:.3f} | "
                     f"{r['speedup_vs_keras']:.2f}x | {r['compile_s']:.2f} | "
                     f"{'' if r['contender'] != 'kerasjit' else format(r['compile_cached_s'], '.2f')} | "
                     f"{r['first_call_rss_growth_mb']:.0f} |")
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return table


def check_models(parser, chosen, known):
    """A usage error for a --models name that is none of `known`."""
    unknown = set(chosen or ()) - set(known)
    if unknown:
        parser.error(f"no model {', '.join(sorted(unknown))}; models: {', '.join(known)}")


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    check_models(parser, args.models, _workloads(args))
    # Compile times from an empty compile cache (a temporary one, gone afterwards).
    os.environ["KERASJIT_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="kerasjit-bench-")
    rows, busy = [], busy_loops(args.busy)
    try:
        for name, work in _workloads(args).items():
            if not args.models or name in args.models:
                rows += bench_model(name, work, args.rounds, args.backend)
    finally:
        for process in busy:
            process.kill()
        shutil.rmtree(cache, ignore_errors=True)
    table = write_reports(rows, args.out, "python -m kerasjit.bench " + " ".join(argv or []),
                          args.name, args.backend, args.busy)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
