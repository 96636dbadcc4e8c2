"""In-place updates: a variable's new value written over its old one.

A donated parameter (a variable's value the runtime will not read again)
shares its buffer with the output holding its update when safe: one loop
kernel stores the update, reading the parameter only at the element it
writes, and no later step reads it. That store moves last in its kernel, so
the other stores still read the old value. Saves a fresh array per variable
per step.
"""
from .ir import (ChunkLoop, Const, GemmCall, ImplicitGemm, Index, Load, LoopKernel, ScatterKernel,
                 rename_buffer, walk)
from .storage import touched


def _at_loop_index(node, dims):
    def same(i, d):
        return (isinstance(i, Index) and i.dim == d) or (
            dims[d] == 1 and isinstance(i, Const) and i.value == 0)
    return len(node.index) == len(dims) and all(same(i, d) for d, i in enumerate(node.index))


def _reads_only_in_place(kernel, bid):
    """Whether every load of `bid` in `kernel` is at the element the kernel writes."""
    return all(_at_loop_index(node, kernel.dims) for _, expr in kernel.stores
               for node in walk(expr) if isinstance(node, Load) and node.buffer == bid)


def alias_donated(program, donate):
    """Let outputs share donated parameters' buffers where safe.

    donate: {parameter index: output index}. Fills program.aliases
    ({output index: parameter index}) with the pairs it applied."""
    for p, o in sorted((donate or {}).items()):
        param, out = program.params[p], program.outputs[o]
        pb, ob = program.buffers[param], program.buffers[out]
        if (pb.dtype, tuple(pb.dims)) != (ob.dtype, tuple(ob.dims)) or ob.role != "output" \
                or program.outputs.count(out) != 1 or param in program.outputs:
            continue
        writer = [i for i, s in enumerate(program.steps)
                  if isinstance(s, LoopKernel) and any(b == out for b, _ in s.stores)]
        if len(writer) != 1:
            continue
        k = writer[0]
        kernel = program.steps[k]
        if kernel.reduction or any(param in touched(s) for s in program.steps[k + 1:]) \
                or not _reads_only_in_place(kernel, param):
            continue
        (value,) = [e for b, e in kernel.stores if b == out]
        kernel.stores = [(b, e) for b, e in kernel.stores if b != out] + [(out, value)]
        _rename(program.steps, out, param, {})    # later steps read the new value there
        program.outputs[o] = param
        program.aliases[o] = p
    return program


def _rename(steps, old, new, memo):
    for step in steps:
        if isinstance(step, ChunkLoop):
            _rename(step.steps, old, new, memo)
        elif isinstance(step, (GemmCall, ImplicitGemm)):
            step.out, step.lhs, step.rhs = (new if b == old else b
                                            for b in (step.out, step.lhs, step.rhs))
            if isinstance(step, ImplicitGemm) and step.epilogue is not None:
                step.epilogue = rename_buffer(step.epilogue, old, new, memo)
        else:
            step.stores = [(new if b == old else b, rename_buffer(e, old, new, memo))
                           for b, e in step.stores]
            if isinstance(step, ScatterKernel):     # (parts of its stored value, same memo)
                step.target = tuple(rename_buffer(e, old, new, memo) for e in step.target)
                step.update = rename_buffer(step.update, old, new, memo)
                step.fits = step.fits and rename_buffer(step.fits, old, new, memo)
