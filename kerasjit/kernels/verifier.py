"""The kernel-IR verifier: what every pass after lowering must keep true.

Every buffer a step names exists; a step reads only parameters, constants
and what earlier steps wrote; a loop kernel or GEMM reads no memory it
writes (its buffers are noalias; after storage assignment, no slot it writes
is one it reads), but for a donated parameter it updates in place (aliasing.py
checks those); a multi-output reduction accumulates rows (the one form that
stores its terms); every output is written."""
from ..errors import KernelVerifyError
from .collapse import rows_can_accumulate
from .ir import (GemmCall, LoopKernel, MultiOutputReduction, ScatterKernel, WhileLoop, kernel_exprs,
                 nested_steps)
from .storage import loaded, touched, writes


def verify_kernels(program):
    ids = {b.id for b in program.buffers}
    ready = {b.id for b in program.buffers if b.role in ("param", "constant")}
    def memory(bids):       # (where each buffer lives: its slot, else its own)
        return {f"slot {program.storage[b]}" if b in program.storage else f"buffer {b}"
                for b in bids}
    in_place = {program.params[p] for p in program.aliases.values()}

    def visit(steps):
        for step in steps:
            if isinstance(step, WhileLoop):
                in_place.update(step.state)     # (updated in place each iteration)
            for inside in nested_steps(step):
                visit(inside)
            if nested_steps(step):
                continue
            written, read = writes(step), reads(step)
            if not touched(step) <= ids:
                _fail(step, f"names buffers {sorted(touched(step) - ids)} that do not exist")
            if not read <= ready:
                _fail(step, f"reads buffers {sorted(read - ready)} before any step writes them")
            if isinstance(step, MultiOutputReduction) and not rows_can_accumulate(
                    step, program.buffers):
                _fail(step, "stores the terms of a reduction that does not accumulate rows")
            if isinstance(step, (GemmCall, LoopKernel)) and not isinstance(step, ScatterKernel):
                shared = memory(read - in_place) & memory(written)
                if shared:
                    _fail(step, f"reads memory it writes ({', '.join(sorted(shared))})")
            ready.update(written)
    visit(program.steps)
    aliased = set(program.aliases)
    unwritten = [b for i, b in enumerate(program.outputs) if b not in ready and i not in aliased]
    if unwritten:
        raise KernelVerifyError(f"kernel program: outputs {unwritten} are never written")


def reads(step):
    """Buffer ids a (leaf) step reads: what its expressions load (a scatter's
    own result among them: its updates apply to what is there), a GEMM's
    operands, an implicit GEMM's operands and what its epilogue loads besides
    its own result."""
    if isinstance(step, LoopKernel):
        return set().union(*map(loaded, kernel_exprs(step)))
    if isinstance(step, GemmCall):
        return {step.lhs, step.rhs}
    return touched(step) - writes(step)


def _fail(step, what):
    raise KernelVerifyError(f"kernel program: step {step.name} {what}")
