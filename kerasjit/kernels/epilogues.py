"""Epilogue fusion: a convolution's elementwise consumer runs inside its implicit GEMM.

Conv2D(activation="relu") is a convolution, then a bias-and-activation loop
that goes through the output in memory twice more. When that loop is the only
reader of the convolution's output and reads it only at its own row-major
position, the implicit GEMM applies the loop's expression to each block of
rows while still in cache, and the loop and the GEMM's own buffer go.
"""
from .ir import S64, FusionDecision, ImplicitGemm, Index, Load, LoopKernel, map_nodes, walk
from .storage import loaded, touched, writes


def fuse_epilogues(program):
    """Give each ImplicitGemm of `program` its consumer loop as epilogue where
    that is valid (in place: the steps and the decisions)."""
    steps = program.steps
    touches = {}        # id(step) -> touched(step), asked of later steps by every GEMM
    i = 0
    while i < len(steps):
        step = steps[i]
        j = _epilogue_of(program, i, touches) if isinstance(step, ImplicitGemm) else None
        if j is not None:
            kernel = steps.pop(j)
            (result, expr), = kernel.stores
            here = Load("f32", result, tuple(Index(S64, d) for d in range(len(kernel.dims))))
            step.epilogue = map_nodes(expr, Load, lambda load: here
                                      if load.buffer == step.out else load, {})
            program.decisions.append(FusionDecision(step.name.removeprefix("igemm_"),
                                                    (kernel.fused or [kernel.name])[-1],
                                                    "fused: the implicit GEMM's epilogue"))
            program.buffers[step.out].role = "unused"
            step.out = result
        i += 1
    return program


def _at_own_element(load, buffer_dims, loop_dims):
    """Whether `load` reads the element at the loop's own row-major position:
    at the loop index, where the two shapes differ only by dims of size 1 (a
    reshape that adds or drops them: Conv1D's output)."""
    kept = [n for n in buffer_dims if n != 1]
    if kept != [n for n in loop_dims if n != 1]:
        return False
    index = [i for i, n in zip(load.index, buffer_dims) if n != 1]
    loop = [d for d, n in enumerate(loop_dims) if n != 1]
    return all(isinstance(i, Index) and i.dim == d for i, d in zip(index, loop))


def _epilogue_of(program, i, touches):
    """The position of the loop that can be ImplicitGemm steps[i]'s epilogue, or
    None. `touches` memoises touched() of the steps after it (which stay as they are)."""
    steps, gemm = program.steps, program.steps[i]
    out = program.buffers[gemm.out]
    if out.role != "temp" or gemm.epilogue is not None:
        return None

    def touched_by(step):
        if id(step) not in touches:
            touches[id(step)] = touched(step)
        return touches[id(step)]
    users = [j for j in range(i + 1, len(steps)) if gemm.out in touched_by(steps[j])]
    if len(users) != 1:
        return None
    j = users[0]
    kernel = steps[j]
    if type(kernel) is not LoopKernel or kernel.reduction or len(kernel.stores) != 1 \
            or not all(_at_own_element(node, out.dims, kernel.dims)
                       for node in walk(kernel.stores[0][1])
                       if isinstance(node, Load) and node.buffer == gemm.out):
        return None
    (result, expr), = kernel.stores
    # Computed in place over the GEMM's f32 output, so its own result must be
    # f32 too, and everything it reads ready (not written) before the GEMM runs.
    # Its last dim must be the GEMM's features: the epilogue indexes a row of C
    # by the result's other dims (not so where a unit feature dim is dropped or
    # a unit dim follows it).
    target = program.buffers[result]
    if target.dtype != "f32" or target.role == "param" or not target.dims \
            or target.dims[-1] != gemm.n:
        return None
    inputs = loaded(expr) - {gemm.out}
    if any(inputs & writes(s) or result in touched_by(s) for s in steps[i + 1:j]):
        return None
    return j
