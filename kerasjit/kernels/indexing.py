"""s64 index arithmetic for kernel expressions, folded as it is built.

Reindexing (broadcast, transpose, reshape, slice, pad...) produces many
index expressions; folding constants and identities here keeps generated
code and dumps small without a separate pass.
"""
from ..hlo.shape import row_major_strides
from .ir import S64, Const, Index, Op


def c64(value):
    return Const(S64, int(value))


def _const(e):
    return e.value if isinstance(e, Const) else None


def add(a, b):
    if _const(a) is not None and _const(b) is not None:
        return c64(_const(a) + _const(b))
    if _const(b) == 0:
        return a
    if _const(a) == 0:
        return b
    return Op(S64, "add", (a, b))


def sub(a, b):
    return a if _const(b) == 0 else add(a, c64(-_const(b))) if _const(b) is not None \
        else Op(S64, "subtract", (a, b))


def mul(a, b):
    if _const(a) is not None and _const(b) is not None:
        return c64(_const(a) * _const(b))
    if _const(b) == 1:
        return a
    if _const(a) == 1:
        return b
    if _const(a) == 0 or _const(b) == 0:
        return c64(0)
    return Op(S64, "multiply", (a, b))


def div(a, n):
    """a // n for a >= 0 and a constant n > 0."""
    if n == 1:
        return a
    if _const(a) is not None:
        return c64(_const(a) // n)
    return Op(S64, "divide", (a, c64(n)))


def mod(a, n):
    """a % n for a >= 0 and a constant n > 0."""
    if n == 1:
        return c64(0)
    if _const(a) is not None:
        return c64(_const(a) % n)
    return Op(S64, "remainder", (a, c64(n)))


def clamp(a, lo, hi):
    if _const(a) is not None:
        return c64(min(max(_const(a), lo), hi))
    return Op(S64, "clamp", (c64(lo), a, c64(hi)))


def compare(a, b, direction):
    return Op("pred", "compare", (a, b), direction)


def both(a, b):
    if a is None:
        return b
    return Op("pred", "and", (a, b))


def linearize(index, dims):
    flat, stride = c64(0), 1
    for i, n in reversed(list(zip(index, dims))):
        if n != 1:
            flat = add(flat, mul(i, c64(stride)))
        stride *= n
    return flat


def delinearize(flat, dims):
    out, stride = [], 1
    for n in reversed(dims):
        out.append(mod(div(flat, stride), n) if stride * n != _total(dims) else div(flat, stride))
        stride *= n
    return tuple(reversed(out))


def load_terms(index, dims):
    """(index Expr, stride) pairs summing to the row-major offset of `index`
    in a buffer of `dims`, unit dims left out. Consecutive components that
    are one value's digits, [x // 4, x % 4] (a reshape between shapes whose
    dims do not align, as a dropout's random words [n, 4] read as [b, t, d]),
    are that value: (x // 4) * 4 + x % 4 is x, an address the vectoriser sees
    run consecutively where it would gather element by element."""
    strides, terms, k = row_major_strides(dims), [], len(index) - 1
    while k >= 0:
        first = _first_digit(index, dims, k)
        if first is not None:           # x's digits in dims[first..k]: x, at k's stride
            terms.append((index[first].args[0], strides[k]))
            k = first - 1
            continue
        if dims[k] != 1:
            terms.append((index[k], strides[k]))
        k -= 1
    return terms


def _is(e, opcode, n):
    return isinstance(e, Op) and e.opcode == opcode and _const(e.args[1]) == n


def _same(a, b):
    """One value: one expression, or the same loop index."""
    return a is b or (isinstance(a, Index) and isinstance(b, Index) and a.dim == b.dim)


def _first_digit(index, dims, k):
    """j where index[j..k] are the digits of one value x in dims[j..k]: x % n_k
    last, (x // within) % n before it, x // within first (unit dims between,
    indexed 0, skipped); None where they are not."""
    last = index[k]
    if not _is(last, "remainder", dims[k]):
        return None
    x, within = last.args[0], dims[k]
    for j in range(k - 1, -1, -1):
        digit = index[j]
        if dims[j] == 1 and _const(digit) == 0:
            continue
        if _is(digit, "divide", within) and _same(digit.args[0], x):
            return j
        if not (_is(digit, "remainder", dims[j]) and _is(digit.args[0], "divide", within)
                and _same(digit.args[0].args[0], x)):
            return None
        within *= dims[j]
    return None


def _total(dims):
    total = 1
    for n in dims:
        total *= n
    return total


def reshape_index(index, out_dims, in_dims):
    """The operand index of a reshape. Dims are matched in groups of equal
    size ([64, 40, 64] <- [64, 40, 4, 16]: 64, 40, then 64 <- 4 x 16), so each
    group's index is linearised and split alone: 64 x 40 x 64 elements read
    at [b, t, c // 16, c % 16], not through b * 2560 + t * 64 + c."""
    if 0 in out_dims or 0 in in_dims:
        return delinearize(linearize(index, out_dims), in_dims)
    out = [(i, n) for i, n in zip(index, out_dims) if n != 1]
    wanted = [d for d, n in enumerate(in_dims) if n != 1]
    result = [c64(0)] * len(in_dims)
    o = w = 0
    while o < len(out):
        group_out, group_in = [out[o]], [wanted[w]]
        size_out, size_in = out[o][1], in_dims[wanted[w]]
        o, w = o + 1, w + 1
        while size_out != size_in:
            if size_out < size_in:
                group_out.append(out[o])
                size_out *= out[o][1]
                o += 1
            else:
                group_in.append(wanted[w])
                size_in *= in_dims[wanted[w]]
                w += 1
        flat = linearize([i for i, _ in group_out], [n for _, n in group_out])
        for d, i in zip(group_in, delinearize(flat, [in_dims[d] for d in group_in])):
            result[d] = i
    return tuple(result)
