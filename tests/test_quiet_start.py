"""TensorFlow loads through kerasjit without its routine start-up lines; other
lines (real errors) still reach stderr."""
import subprocess
import sys

from kerasjit.quiet_start import routine

ABSL = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
CUINIT = ("E0000 00:00:1796175622.803951   10409 cuda_platform.cc:52] failed call to cuInit: "
          "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)")


def test_routine_lines_are_told_from_the_others():
    assert routine(ABSL)
    assert routine("I0000 00:00:1796176701.377716   22188 port.cc:153] oneDNN custom operations "
                   "are on. You may see slightly different numerical results")
    assert routine("To enable the following instructions: AVX2 AVX512F FMA, in other operations, "
                   "rebuild TensorFlow with the appropriate compiler flags.")
    # cuInit failing is noise without a driver, news with one
    assert routine(CUINIT, driver=False) and not routine(CUINIT, driver=True)
    assert not routine("E0000 00:00:1796175627.876291 base_collective_executor.cc:252] "
                       "Collective has timed out waiting for other workers.")
    assert not routine("Traceback (most recent call last):")


def test_tensorflow_loaded_after_kerasjit_prints_none_of_them():
    done = subprocess.run([sys.executable, "-c", "import kerasjit, keras, sys; "
                           "print('after', file=sys.stderr)"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert not [line for line in done.stderr.splitlines() if routine(line)], done.stderr
    assert done.stderr.splitlines()[-1] == "after"   # stderr works as before afterwards


def test_importing_kerasjit_loads_no_tensorflow_until_it_is_used():
    # (so `python -m kerasjit --help` answers at once)
    done = subprocess.run([sys.executable, "-c", "import sys, kerasjit; "
                           "print('tensorflow' in sys.modules); kerasjit.wrap; "
                           "print('tensorflow' in sys.modules); "
                           "print(callable(kerasjit.wrap), callable(kerasjit.explain))"],
                          capture_output=True, text=True, timeout=300)
    assert done.stdout.split() == ["False", "True", "True", "True"], done.stderr
    helped = subprocess.run([sys.executable, "-m", "kerasjit", "--help"], capture_output=True,
                            text=True, timeout=300)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: python -m kerasjit")
