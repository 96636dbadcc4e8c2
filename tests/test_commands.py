"""The benchmark commands: a wrong model name is an error that lists the
models; the data-parallel benchmark writes its report."""
import subprocess
import sys

import pandas as pd
import pytest

from kerasjit import bench, bench_distribute


@pytest.mark.parametrize("command", [bench, bench_distribute])
def test_an_unknown_model_is_refused_with_the_known_ones(command, capsys):
    with pytest.raises(SystemExit) as exited:
        command.main(["--models", "nonsense", "mnist_cnn"])
    assert exited.value.code == 2
    assert "no model nonsense; models: " in capsys.readouterr().err


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
