"""The HLO fuzzer (fuzz_hlo.py) within a fixed budget: random programs through
the CPU backend and the GPU backend's kernels built for the host, against the
evaluator; its shrinker on a planted bug."""
import collections

from kerasjit.hlo import parse_module
from kerasjit.hlo.evaluator import evaluate
from kerasjit.hlo.opcodes import ELEMENTWISE, OPCODES

from tests.fuzz import fuzz_hlo
from tests.support.cuda_host import tool

SEED = 0
CPU_PROGRAMS = 1000         # about a minute on two cores
GPU_HOST_PROGRAMS = 200     # four g++ builds


def fuzz_clean(backend, programs):
    try:
        report = fuzz_hlo.fuzz(SEED, programs, [backend], log=lambda line: None)
    finally:
        backend.close()
    assert not report.failures, "\n\n".join(
        f"seed={seed} index={index} {f.backend} {f.kind}: {f.message}\n{program}"
        for seed, index, f, program in report.failures)
    assert report.ran == {backend.name: programs}


def test_cpu_backend_matches_the_evaluator_on_random_programs():
    fuzz_clean(fuzz_hlo.Isolated("cpu"), CPU_PROGRAMS)


def test_gpu_kernels_on_the_host_match_the_evaluator_on_random_programs():
    tool("g++")
    fuzz_clean(fuzz_hlo.Isolated("gpu-host"), GPU_HOST_PROGRAMS)


class MaximumIsMinimum:
    """A backend wrong on one opcode: the evaluator, with maximum computing minimum."""
    name, batch = "maximum-is-minimum", 1

    def run(self, cases):
        results = []
        for text, args in cases:
            module = parse_module(text)
            for comp in module.computations:
                for inst in comp.instructions:
                    if inst.opcode == "maximum":
                        inst.opcode = "minimum"
            results.append(fuzz_hlo.outputs_of(evaluate(module, args)))
        return results


def test_the_shrinker_reduces_a_planted_bug_to_a_small_program_with_that_opcode():
    backend = MaximumIsMinimum()
    report = fuzz_hlo.fuzz(SEED, 40, [backend], shrink_failures=False, log=lambda line: None)
    assert report.failures
    seed, index, failure, program = report.failures[0]
    assert failure.kind == "mismatch"
    smallest = parse_module(fuzz_hlo.shrink(program, seed, index, backend, failure,
                                            log=lambda line: None))
    opcodes = [i.opcode for c in smallest.computations for i in c.instructions]
    assert "maximum" in opcodes
    assert len(smallest.entry.instructions) <= 4, fuzz_hlo.print_module(smallest)
    assert len(smallest.entry.instructions) < len(parse_module(program).entry.instructions)


def test_every_elementwise_opcode_is_generated_or_excluded_with_a_reason():
    elementwise = {name for name, op in OPCODES.items() if op.kind == ELEMENTWISE}
    generated = (set(fuzz_hlo.FLOAT_OPS) | set(fuzz_hlo.INT_OPS) | set(fuzz_hlo.PRED_OPS)
                 | fuzz_hlo.SPECIAL_OPS)
    assert elementwise - generated == set(fuzz_hlo.NOT_GENERATED)


def test_programs_cover_the_constructs_and_replay_alone():
    seen = collections.Counter()
    for index in range(300):
        module = parse_module(fuzz_hlo.generate(SEED, index))
        for inst in module.entry.instructions:
            seen[inst.opcode] += 1
            seen["variadic reduce"] += inst.opcode == "reduce" and inst.shape.is_tuple
            seen["strided slice"] += inst.opcode == "slice" and any(
                stride > 1 for _, _, stride in inst.attrs["slice"])
            seen["negative or interior pad"] += inst.opcode == "pad" and any(
                lo < 0 or hi < 0 or interior for lo, hi, interior in inst.attrs["padding"])
            seen["dot batch dims"] += inst.opcode == "dot" and bool(inst.attrs.get(
                "lhs_batch_dims"))
            seen["feature groups"] += inst.attrs.get("feature_group_count", 1) > 1
            seen["batch groups"] += inst.attrs.get("batch_group_count", 1) > 1
            seen["tuple output"] += inst is module.entry.root and inst.opcode == "tuple"
            state = inst.operands[0].operands if inst.opcode == "while" else []
            seen["loop state holding a value twice"] += len(set(state)) < len(state)
            seen["batching dims"] += bool(inst.attrs.get("operand_batching_dims")
                                          or inst.attrs.get("input_batching_dims"))
            seen["empty operand"] += any(op.shape.size == 0 for op in inst.operands
                                         if not op.shape.is_tuple)
    wanted = {"add", "log", "divide", "shift-left", "compare", "select", "clamp", "convert",
              "bitcast-convert", "broadcast", "reshape", "transpose", "slice", "pad",
              "concatenate", "reverse", "reduce", "reduce-window", "dot", "convolution", "iota",
              "dynamic-slice", "dynamic-update-slice", "variadic reduce", "strided slice",
              "negative or interior pad", "dot batch dims", "feature groups", "batch groups",
              "tuple output", "while", "loop state holding a value twice", "empty operand",
              "gather", "scatter", "batching dims"}
    assert not {w for w in wanted if not seen[w]}
    assert fuzz_hlo.generate(SEED, 123) == fuzz_hlo.generate(SEED, 123) \
        != fuzz_hlo.generate(SEED, 124)
