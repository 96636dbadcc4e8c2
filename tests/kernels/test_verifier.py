"""The kernel-IR verifier (kernels/verifier.py) accepts what lowering makes and
names the step that breaks an invariant."""
import pytest

from kerasjit.errors import KernelVerifyError
from kerasjit.hlo import parse_module
from kerasjit.kernels.ir import S64, Buffer, Index, KernelProgram, Load, LoopKernel, Op
from kerasjit.compiler import lower
from kerasjit.kernels.verifier import verify_kernels
from kerasjit.passes import optimize

from tests.support.bridge import bridge
from tests.support.structured_cases import DOT_CONV_POOL, LOOP_ONLY
from tests.support.targets import CPU, PATCHES


def _program(*steps, outputs=(2,), storage=None):
    buffers = [Buffer(0, "f32", (4,), "param"), Buffer(1, "f32", (4,), "temp"),
               Buffer(2, "f32", (4,), "output")]
    return KernelProgram(buffers, list(steps), [0], list(outputs), storage=storage or {})


def _load(bid):
    return Load("f32", bid, (Index(S64, 0),))


def _copy(name, src, dst):
    return LoopKernel(name, (4,), [(dst, Op("f32", "negate", (_load(src),)))])


def test_a_valid_program_passes():
    verify_kernels(_program(_copy("a", 0, 1), _copy("b", 1, 2)))


@pytest.mark.parametrize("program, message", [
    (_program(_copy("b", 1, 2), _copy("a", 0, 1)), "step b reads buffers \\[1\\] before"),
    (_program(_copy("a", 0, 7)), "step a names buffers \\[7\\]"),
    (_program(_copy("a", 0, 1)), "outputs \\[2\\] are never written"),
    (_program(_copy("a", 0, 1), LoopKernel("b", (4,), [(1, _load(1))]), _copy("c", 1, 2)),
     "step b reads memory it writes"),
])
def test_a_broken_program_names_its_step(program, message):
    with pytest.raises(KernelVerifyError, match=message):
        verify_kernels(program)


def test_a_donated_parameter_updated_in_place_verifies():
    module = parse_module("""HloModule update
ENTRY %e (w: f32[8,4], g: f32[8,4]) -> f32[8,4] {
  %w = f32[8,4] parameter(0)
  %g = f32[8,4] parameter(1)
  %c = f32[] constant(0.1)
  %b = f32[8,4] broadcast(f32[] %c), dimensions={}
  %s = f32[8,4] multiply(f32[8,4] %b, f32[8,4] %g)
  ROOT %n = f32[8,4] subtract(f32[8,4] %w, f32[8,4] %s)
}
""")
    program = lower(module, PATCHES, {0: 0}, verify=True)
    assert program.aliases == {0: 0}


@pytest.mark.parametrize("implicit_gemm", [False, True])
@pytest.mark.parametrize("name", sorted({**LOOP_ONLY, **DOT_CONV_POOL}))
def test_every_lowered_case_verifies_after_each_pass(name, implicit_gemm):
    fn, args = {**LOOP_ONLY, **DOT_CONV_POOL}[name]
    module = bridge(fn, *args)
    optimize(module)
    lower(module, CPU if implicit_gemm else PATCHES, verify=True)
