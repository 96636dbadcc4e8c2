"""`python -m kerasjit.bench`: plain Keras vs Keras+XLA vs Keras on JAX vs kerasjit, in one run.

Each contender trains its own copy of a model on the same synthetic data, in
interleaved rounds so drift in the machine's speed hits all alike; Keras on
JAX (where jax is installed; --no-jax leaves it out) in a process of its own
that this one drives round by round. Timed: an epoch of `fit` (shuffled;
also with steps_per_execution), `evaluate` and `predict`; speed is the
median round after the first. Compile time is a model's first short call
minus its next ones (cache empty, then from the cache for kerasjit). Writes
reports/benchmark.csv and .md (--name changes the stem; --backend picks
kerasjit's backend, e.g. gpu).
"""
import argparse
import contextlib
import importlib.util
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
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
    parser.add_argument("--no-jax", action="store_true",
                        help="leave out Keras on JAX (keras_jax, a process of its own)")
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

from kerasjit.backends import get_backend  # noqa: E402
from kerasjit.bench_peer import JaxPeer  # noqa: E402
from kerasjit.bench_suite import (Contender, build_model, runner, short_call_samples,  # noqa: E402
                                  steps_per_execution_for, suite, timed)

CONTENDERS = ("keras", "keras_xla", "keras_jax", "kerasjit")
# Before each timed call: the worker threads the previous call woke (TensorFlow's,
# XLA's and OpenBLAS's pools spin a while before sleeping) must not steal the
# cores from the next contender, as they would not in a process of its own.
PAUSE_S = 0.5


def _make(contender, build, backend, steps_per_execution=1):
    model = build_model(build, contender == "keras_xla", steps_per_execution)
    return kerasjit.wrap(model, backend=backend, background=False) if contender == "kerasjit" \
        else model


def bench_model(name, work, rounds, backend="auto", keras_jax=None):
    """The rows of one workload, and its convolution rates (convolution_rates);
    `keras_jax`: a JaxPeer with it loaded (None: not measured)."""
    x, y = work.data(work.steps * work.batch)
    contenders = {c: keras_jax if c == "keras_jax" else
                  Contender(work, x, y, lambda spe: _make(c, work.build, backend, spe))
                  for c in CONTENDERS if c != "keras_jax" or keras_jax is not None}
    # Compile time: each model's first call minus its next ones, on a call of a few batches.
    first, again, rss = {}, {}, {}
    for mode in work.modes:
        for c, contender in contenders.items():
            time.sleep(PAUSE_S)
            first[mode, c], again[mode, c], rss[mode, c] = contender.first_calls(mode)
    times = {(mode, c): [] for mode in work.modes for c in contenders}
    for r in range(rounds):
        for mode, c in times:
            time.sleep(PAUSE_S)
            times[mode, c].append(contenders[c].round(mode))
        print(f"  {name} round {r + 1}/{rounds}: " + ", ".join(
            f"{mode}/{c} {t[-1]:.3f}s" for (mode, c), t in times.items()), flush=True)
    # kerasjit's compile again, for a new copy of the model: its native code now comes
    # from the compile cache, as on every run after a model's first.
    cached = {}
    for mode in work.modes:
        fresh = _make("kerasjit", work.build, backend, steps_per_execution_for(mode))
        short = short_call_samples(work, mode)
        cached[mode] = timed(runner(mode, fresh, x[:short], y[:short], work.batch)) \
            - again[mode, "kerasjit"]
    rows = []
    for mode in work.modes:
        base = statistics.median(times[mode, "keras"][1:])
        for c in contenders:
            median = statistics.median(times[mode, c][1:])
            rows.append({"model": name, "mode": mode, "contender": c, "batch": work.batch,
                         "steps": work.steps,
                         "steps_per_execution": steps_per_execution_for(mode),
                         "median_s": median, "ms_per_step": 1000 * median / work.steps,
                         "compile_s": max(0.0, first[mode, c] - again[mode, c]),
                         "compile_cached_s": max(0.0, cached[mode]) if c == "kerasjit"
                         else float("nan"),
                         "speedup_vs_keras": base / median,
                         "first_call_rss_growth_mb": rss[mode, c]})
    convolutions = convolution_rates(name, work, backend, x, y, next(
        r["ms_per_step"] for r in rows if r["mode"] == "fit" and r["contender"] == "kerasjit")) \
        if "fit" in work.modes and get_backend(backend).name == "cpu" else []
    return rows, convolutions


# A convolution kernel's form, by the op it computes (its name says: TensorFlow's
# Conv2DBackpropFilter, ..., or HLO's convolution for the forward one).
_OPS = (("backpropfilter", "filter gradient"), ("backpropinput", "input gradient"),
        ("conv", "forward"))


def _convolution_form(kernel):
    """'forward, implicit GEMM' and the like for a convolution's kernel-profile
    label, else None."""
    op = next((form for word, form in _OPS if word in kernel.lower()), None)
    kind = "implicit GEMM, dot products" if "dot products" in kernel else \
        "implicit GEMM" if "implicit GEMM" in kernel else \
        "patches + sgemm" if "sgemm" in kernel else None
    return op and kind and f"{op}, {kind}"


def convolution_rates(name, work, backend, x, y, ms_per_step):
    """kerasjit's convolutions in an epoch of `fit`: per form, GFLOP and
    GFLOP/s (the kernel profile of a copy of the model compiled with
    KERASJIT_PROFILE_KERNELS=1), and all of them over `ms_per_step`, the
    whole step's time in the timed rounds."""
    from kerasjit.backends.cpu.profile import kernel_profile
    os.environ["KERASJIT_PROFILE_KERNELS"] = "1"        # (read when a step compiles)
    try:
        model = _make("kerasjit", work.build, backend)
        fit = runner("fit", model, x, y, work.batch)
        fit()
    finally:
        del os.environ["KERASJIT_PROFILE_KERNELS"]
    kernel_profile(reset=True)
    fit()
    profile = kernel_profile()
    profile["form"] = profile["kernel"].map(_convolution_form)
    profile = profile[(profile["calls"] > 0) & profile["form"].notna()]
    # Per call of the compiled step, not per step of the epoch: the race runs
    # some of a wrapped model's first steps in TensorFlow.
    profile = profile.assign(gflop=profile["gflops"] * profile["seconds"] / profile["calls"],
                             seconds=profile["seconds"] / profile["calls"])
    rows = [{"model": name, "form": form, "gflop_per_step": group["gflop"].sum(),
             "ms_per_step": 1000 * group["seconds"].sum(),
             "gflops": group["gflop"].sum() / group["seconds"].sum()}
            for form, group in profile.groupby("form")]
    if rows:
        total = sum(r["gflop_per_step"] for r in rows)
        rows.append({"model": name, "form": "whole step", "gflop_per_step": total,
                     "ms_per_step": ms_per_step, "gflops": total / ms_per_step * 1000})
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


# Environment settings that change what a benchmark measures: the report's
# command names those set, so that it reproduces the run.
MEASURED_SETTINGS = ("KERASJIT_CPU", "KERASJIT_SKIP_PASSES", "TF_ENABLE_ONEDNN_OPTS",
                     "OPENBLAS_NUM_THREADS", "KERASJIT_BACKGROUND")


def command_line(module, argv):
    """A report's `Command:` line: the settings of MEASURED_SETTINGS that are set,
    `python -m module argv...`, and when it ran."""
    settings = [f"{k}={os.environ[k]}" for k in MEASURED_SETTINGS if k in os.environ]
    command = " ".join([*settings, "python -m", module, *argv])
    return f"Command: `{command}` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC)"


def busy_loops(n):
    """`n` processes that keep a core each busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


_COMPARED = {"keras": "Keras", "keras_xla": "Keras+XLA", "keras_jax": "Keras on JAX"}


def _kerasjit_speedups(rows):
    """Markdown lines: per model and mode, kerasjit's speedup over each other
    contender measured (its ms/step over kerasjit's), in bold where under 1."""
    ms = {(r["model"], r["mode"], r["contender"]): r["ms_per_step"] for r in rows}
    others = [c for c in _COMPARED if any(r["contender"] == c for r in rows)]
    lines = ["| model | mode | " + " | ".join(f"kerasjit vs {_COMPARED[c]}" for c in others)
             + " |", "|---|---|" + "---:|" * len(others)]
    for model, mode in dict.fromkeys((r["model"], r["mode"]) for r in rows):
        speedups = (ms[model, mode, c] / ms[model, mode, "kerasjit"] for c in others)
        lines.append(f"| {model} | {mode} | " + " | ".join(
            f"**{s:.2f}x**" if s < 1 else f"{s:.2f}x" for s in speedups) + " |")
    return lines


def write_reports(rows, out_dir, command, name="benchmark", backend="auto", busy=0,
                  keras_jax="not measured", convolutions=()):
    """`keras_jax`: the header's word on Keras on JAX (its JAX, or why it was not
    measured); `convolutions`: convolution_rates' rows (also NAME_convolutions.csv)."""
    os.makedirs(out_dir, exist_ok=True)
    table = pd.DataFrame(rows)
    table.to_csv(os.path.join(out_dir, f"{name}.csv"), index=False, float_format="%.6g")
    beside = f"; {busy} busy-loop process(es) ran beside the benchmark" if busy else ""
    lines = ["# kerasjit benchmark", "",
             f"Machine: {machine(backend)}; Keras on JAX: {keras_jax}{beside}", "",
             command, "",
             "Median round after the first; contenders interleaved round by round: plain "
             "Keras, Keras+XLA and kerasjit in the benchmark's process, Keras on JAX "
             "(`keras_jax`, its steps jit-compiled, Keras's default on JAX) in a process of "
             "its own, which the benchmark drives round by round, waiting for each of its "
             "calls. A round is one call: an epoch of `fit` with default arguments "
             "(shuffled), the same with `steps_per_execution` (`fit_spe`), `evaluate` or "
             "`predict` over the same data, or a loop of `train_on_batch` calls, one per "
             "batch (`train_on_batch`, as a custom training loop runs). `compile s`, "
             "measured before the rounds on calls of a few batches (2, or one execution of "
             "`fit_spe`): a model's first call minus its next ones, with kerasjit's compile "
             "cache empty; `cached` = the same for a new copy of the model afterwards, its "
             "native code from the cache (as on every run after a model's first). RSS "
             "growth: over that first call, in the contender's process.", "",
             "| model | mode | contender | ms/step | speedup vs Keras | compile s "
             "| cached | first-call RSS growth MB |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['mode']} | {r['contender']} | {r['ms_per_step']:.3f} | "
                     f"{r['speedup_vs_keras']:.2f}x | {r['compile_s']:.2f} | "
                     f"{'' if r['contender'] != 'kerasjit' else format(r['compile_cached_s'], '.2f')} | "
                     f"{r['first_call_rss_growth_mb']:.0f} |")
    lines += ["", "kerasjit's speedup over each other contender (that one's ms/step over "
              "kerasjit's; in bold where kerasjit is not ahead):", "", *_kerasjit_speedups(rows)]
    if convolutions:
        pd.DataFrame(convolutions).to_csv(os.path.join(out_dir, f"{name}_convolutions.csv"),
                                          index=False, float_format="%.6g")
        lines += ["", *_convolution_table(convolutions)]
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return table


def _convolution_table(convolutions):
    """The report's convolution rates, read against the machine's measured peak."""
    from kerasjit.backends.cpu.parallel import usable_cores
    from kerasjit.backends.cpu.peak import fma_peak_gflops
    cores = usable_cores()
    peak = fma_peak_gflops(cores)
    lines = [f"kerasjit's convolutions in `fit`, from the kernel profile of a copy of each "
             f"model (KERASJIT_PROFILE_KERNELS=1, one epoch): GFLOP and time per step of each "
             f"form, and its rate; `whole step`: all of them over the step's time in the "
             f"rounds above. The f32 multiply-add peak measured here: {peak:.0f} GFLOP/s on "
             f"{cores} thread(s) ({fma_peak_gflops(1):.0f} on one).", "",
             "| model | form | GFLOP/step | ms/step | GFLOP/s | of peak |",
             "|---|---|---:|---:|---:|---:|"]
    for r in convolutions:
        lines.append(f"| {r['model']} | {r['form']} | {r['gflop_per_step']:.3f} | "
                     f"{r['ms_per_step']:.2f} | {r['gflops']:.0f} | {r['gflops'] / peak:.0%} |")
    return lines


def check_models(parser, chosen, known):
    """A usage error for a --models name that is none of `known`."""
    unknown = set(chosen or ()) - set(known)
    if unknown:
        parser.error(f"no model {', '.join(sorted(unknown))}; models: {', '.join(known)}")


def main(argv=None):
    parser = _parser()
    args = parser.parse_args(argv)
    workloads = suite(args)
    check_models(parser, args.models, workloads)
    jax_left_out = "--no-jax" if args.no_jax else \
        None if importlib.util.find_spec("jax") else "jax is not installed"
    if jax_left_out == "jax is not installed":
        print("keras_jax not measured: jax is not installed; pip install 'jax[cpu]'", flush=True)
    # Compile times from an empty compile cache (a temporary one, gone afterwards).
    os.environ["KERASJIT_CACHE_DIR"] = cache = tempfile.mkdtemp(prefix="kerasjit-bench-")
    rows, convolutions, busy = [], [], busy_loops(args.busy)
    try:
        # One Keras-on-JAX peer for the whole run, as the benchmark's process serves the
        # other contenders: JAX starts once; each load drops the previous workload.
        with contextlib.nullcontext() if jax_left_out else JaxPeer() as peer:
            for name, work in workloads.items():
                if not args.models or name in args.models:
                    if peer:
                        peer.load(name, vars(args))
                    timed_rows, rates = bench_model(name, work, args.rounds, args.backend, peer)
                    rows += timed_rows
                    convolutions += rates
    finally:
        for process in busy:
            process.kill()
        shutil.rmtree(cache, ignore_errors=True)
    table = write_reports(rows, args.out, command_line("kerasjit.bench", argv or []),
                          args.name, args.backend, args.busy,
                          f"not measured ({jax_left_out})" if jax_left_out else peer.description,
                          convolutions)
    print(table.to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1:])
