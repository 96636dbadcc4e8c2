"""The benchmark commands: a wrong model name is an error that lists the
models; the benchmark times its four contenders (Keras on JAX through its
peer process, which loads no TensorFlow); the data-parallel benchmark writes
its report."""
import subprocess
import sys

import pandas as pd
import pytest

from kerasjit import bench, bench_distribute
from kerasjit.bench_peer import JaxPeer


@pytest.mark.parametrize("command", [bench, bench_distribute])
def test_an_unknown_model_is_refused_with_the_known_ones(command, capsys):
    with pytest.raises(SystemExit) as exited:
        command.main(["--models", "nonsense", "mnist_cnn"])
    assert exited.value.code == 2
    assert "no model nonsense; models: " in capsys.readouterr().err


def test_the_benchmark_times_every_contender_in_every_mode(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kerasjit.bench", "--models", "softmax_regression",
                           "--softmax-steps", "4", "--rounds", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "benchmark.csv")
    assert sorted(zip(table["mode"], table["contender"])) == sorted(
        (mode, c) for mode in ("fit", "fit_spe", "evaluate", "predict", "train_on_batch")
        for c in bench.CONTENDERS)
    assert (table["ms_per_step"] > 0).all()
    report = (tmp_path / "benchmark.md").read_text()
    assert "Keras on JAX: JAX " in report
    assert ("| model | mode | kerasjit vs Keras | kerasjit vs Keras+XLA "
            "| kerasjit vs Keras on JAX |") in report


def test_the_keras_on_jax_peer_times_a_round_without_tensorflow():
    args = vars(bench._parser().parse_args(["--softmax-steps", "4"]))
    with JaxPeer() as peer:
        peer.load("softmax_regression", args)
        assert peer.round("fit") > 0
        with pytest.raises(RuntimeError, match="KeyError: 'nonsense'"):
            peer.load("nonsense", args)
        assert peer.tensorflow_loaded is False


def test_a_report_without_keras_on_jax_says_so_and_compares_with_the_others(tmp_path):
    rows = [{"model": "m", "mode": "fit", "contender": c, "ms_per_step": ms, "compile_s": 1.0,
             "compile_cached_s": 0.5, "speedup_vs_keras": 4 / ms, "first_call_rss_growth_mb": 1}
            for c, ms in [("keras", 4.0), ("keras_xla", 1.0), ("kerasjit", 2.0)]]
    bench.write_reports(rows, tmp_path, "bench", keras_jax="not measured (--no-jax)")
    report = (tmp_path / "benchmark.md").read_text()
    assert "Keras on JAX: not measured (--no-jax)" in report
    assert "| model | mode | kerasjit vs Keras | kerasjit vs Keras+XLA |\n" in report
    assert "| m | fit | 2.00x | **0.50x** |" in report


def test_convolution_rates_come_per_form_and_for_the_whole_step(tmp_path, monkeypatch):
    """The MNIST convnet's convolutions, from a profiled copy: forward, input
    and filter gradient, each with a positive rate; the report reads them
    against the machine's measured peak."""
    monkeypatch.setenv("KERASJIT_CACHE_DIR", str(tmp_path / "cache"))
    args = bench._parser().parse_args(["--mnist-steps", "2"])
    work = bench.suite(args)["mnist_cnn"]
    x, y = work.data(work.steps * work.batch)
    rows = bench.convolution_rates("mnist_cnn", work, "cpu", x, y, ms_per_step=50.0)
    forms = {r["form"] for r in rows}
    assert {"forward, implicit GEMM", "filter gradient, implicit GEMM", "whole step"} <= forms
    assert all(r["gflops"] > 0 and r["gflop_per_step"] > 0 for r in rows)
    # a step's forward GFLOP: both convolutions' multiply-adds, however many of
    # the epoch's steps the race left to TensorFlow
    (forward,) = [r for r in rows if r["form"] == "forward, implicit GEMM"]
    b = work.batch
    assert forward["gflop_per_step"] == pytest.approx(
        2 * (b * 26 * 26 * 32 * 9 + b * 11 * 11 * 64 * 288) / 1e9, rel=1e-6)
    (step,) = [r for r in rows if r["form"] == "whole step"]
    assert step["gflop_per_step"] == pytest.approx(sum(r["gflop_per_step"] for r in rows
                                                       if r is not step))
    table = "\n".join(bench._convolution_table(rows))
    assert "The f32 multiply-add peak measured here: " in table and "| mnist_cnn | whole step |" in table


def test_the_data_parallel_benchmark_times_both_contenders(tmp_path):
    done = subprocess.run([sys.executable, "-m", "kerasjit.bench_distribute", "--steps", "4",
                           "--rounds", "2", "--models", "mlp_784_256_10", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "distribute.csv")
    assert sorted(zip(table["replicas"], table["contender"])) == [
        (1, "keras"), (1, "kerasjit"), (2, "keras"), (2, "kerasjit")]
    assert (table["ms_per_step"] > 0).all()
    assert "MirroredStrategy" in (tmp_path / "distribute.md").read_text()


@pytest.mark.parametrize("module", ["kerasjit", "kerasjit.bench", "kerasjit.bench_distribute",
                                    "kerasjit.bench_startup"])
def test_help_answers_before_tensorflow_loads(module):
    # TensorFlow's import is what took a command's --help 12-16 s.
    probe = (f"import runpy, sys; sys.argv = ['{module}', '--help']\n"
             f"try: runpy.run_module('{module}', run_name='__main__')\n"
             "except SystemExit as done: assert done.code == 0\n"
             "print('tensorflow' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m {module}")
    assert done.stderr.split() == ["False"], done.stderr


def test_a_reports_command_names_the_settings_that_change_what_it_measured(monkeypatch):
    """A run with AVX2 code and TensorFlow's oneDNN kernels off reproduces only
    with those settings: the report's command line carries them."""
    for name in bench.MEASURED_SETTINGS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("KERASJIT_CPU", "avx2")
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    line = bench.command_line("kerasjit.bench", ["--rounds", "3"])
    assert line.startswith("Command: `KERASJIT_CPU=avx2 TF_ENABLE_ONEDNN_OPTS=0 "
                           "python -m kerasjit.bench --rounds 3` (")
