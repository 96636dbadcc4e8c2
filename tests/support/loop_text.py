"""HLO texts of while loops and conditionals, for the evaluator and the backends."""
from tests.support.hlo_text import hlo

# A loop over (i, acc[3], seq[5,3], w[3]) while i < 5: acc = acc * w + seq[i]
# (a per-step slice), seq[i] = acc (the list of per-step values written in
# place), w passed on unchanged.
_STATE = "(s32[], f32[3], f32[5,3], f32[3])"
LIST_LOOP_CALLEES = f"""%cond (c.p: {_STATE}) -> pred[] {{
  %c.p = {_STATE} parameter(0)
  %c.i = s32[] get-tuple-element({_STATE} %c.p), index=0
  %c.n = s32[] constant(5)
  ROOT %c.lt = pred[] compare(s32[] %c.i, s32[] %c.n), direction=LT
}}

%body (b.p: {_STATE}) -> {_STATE} {{
  %b.p = {_STATE} parameter(0)
  %b.i = s32[] get-tuple-element({_STATE} %b.p), index=0
  %b.acc = f32[3] get-tuple-element({_STATE} %b.p), index=1
  %b.seq = f32[5,3] get-tuple-element({_STATE} %b.p), index=2
  %b.w = f32[3] get-tuple-element({_STATE} %b.p), index=3
  %b.zero = s32[] constant(0)
  %b.row = f32[1,3] dynamic-slice(f32[5,3] %b.seq, s32[] %b.i, s32[] %b.zero), dynamic_slice_sizes={{1,3}}
  %b.x = f32[3] reshape(f32[1,3] %b.row)
  %b.scaled = f32[3] multiply(f32[3] %b.acc, f32[3] %b.w)
  %b.next = f32[3] add(f32[3] %b.scaled, f32[3] %b.x)
  %b.put = f32[1,3] reshape(f32[3] %b.next)
  %b.seq2 = f32[5,3] dynamic-update-slice(f32[5,3] %b.seq, f32[1,3] %b.put, s32[] %b.i, s32[] %b.zero)
  %b.one = s32[] constant(1)
  %b.i2 = s32[] add(s32[] %b.i, s32[] %b.one)
  ROOT %b.t = {_STATE} tuple(s32[] %b.i2, f32[3] %b.next, f32[5,3] %b.seq2, f32[3] %b.w)
}}"""

LIST_LOOP = hlo(f"""  %seq = f32[5,3] parameter(0)
  %w = f32[3] parameter(1)
  %i0 = s32[] constant(0)
  %acc0 = f32[3] constant({{0, 0, 0}})
  %init = {_STATE} tuple(s32[] %i0, f32[3] %acc0, f32[5,3] %seq, f32[3] %w)
  %loop = {_STATE} while({_STATE} %init), condition=%cond, body=%body
  %acc = f32[3] get-tuple-element({_STATE} %loop), index=1
  %out = f32[5,3] get-tuple-element({_STATE} %loop), index=2
  ROOT %t = (f32[3], f32[5,3]) tuple(f32[3] %acc, f32[5,3] %out)""", LIST_LOOP_CALLEES)

def accumulating_loop(read_row):
    """A loop over (i, seq[5,3], g[3]) while i < 5: seq[i] = seq[read_row] + g * i
    (`read_row`: an s32 expression of %a.i): with "%a.i", a list's item read,
    updated and stored back, as a recurrent layer's gradient accumulates per step."""
    state = "(s32[], f32[5,3], f32[3])"
    return hlo(f"""  %seq = f32[5,3] parameter(0)
  %g = f32[3] parameter(1)
  %i0 = s32[] constant(0)
  %init = {state} tuple(s32[] %i0, f32[5,3] %seq, f32[3] %g)
  %loop = {state} while({state} %init), condition=%a.cond, body=%a.body
  ROOT %out = f32[5,3] get-tuple-element({state} %loop), index=1""", f"""%a.cond (c.p: {state}) -> pred[] {{
  %c.p = {state} parameter(0)
  %c.i = s32[] get-tuple-element({state} %c.p), index=0
  %c.n = s32[] constant(5)
  ROOT %c.lt = pred[] compare(s32[] %c.i, s32[] %c.n), direction=LT
}}

%a.body (a.p: {state}) -> {state} {{
  %a.p = {state} parameter(0)
  %a.i = s32[] get-tuple-element({state} %a.p), index=0
  %a.seq = f32[5,3] get-tuple-element({state} %a.p), index=1
  %a.g = f32[3] get-tuple-element({state} %a.p), index=2
  %a.zero = s32[] constant(0)
  %a.four = s32[] constant(4)
  %a.at = s32[] {read_row}
  %a.row = f32[1,3] dynamic-slice(f32[5,3] %a.seq, s32[] %a.at, s32[] %a.zero), dynamic_slice_sizes={{1,3}}
  %a.fi = f32[] convert(s32[] %a.i)
  %a.fb = f32[3] broadcast(f32[] %a.fi), dimensions={{}}
  %a.gi = f32[3] multiply(f32[3] %a.g, f32[3] %a.fb)
  %a.step = f32[1,3] reshape(f32[3] %a.gi)
  %a.sum = f32[1,3] add(f32[1,3] %a.row, f32[1,3] %a.step)
  %a.seq2 = f32[5,3] dynamic-update-slice(f32[5,3] %a.seq, f32[1,3] %a.sum, s32[] %a.i, s32[] %a.zero)
  %a.one = s32[] constant(1)
  %a.i2 = s32[] add(s32[] %a.i, s32[] %a.one)
  ROOT %a.t = {state} tuple(s32[] %a.i2, f32[5,3] %a.seq2, f32[3] %a.g)
}}""")


# Nested loops with a nested tuple state and a swap: the inner loop runs j
# to i, exchanging (a, b) and adding; the outer one counts i to 4.
_INNER = "(s32[], (f32[2], f32[2]))"
_OUTER = "(s32[], f32[2], f32[2])"
NESTED = hlo(f"""  %x = f32[2] parameter(0)
  %y = f32[2] parameter(1)
  %zero = s32[] constant(0)
  %init = {_OUTER} tuple(s32[] %zero, f32[2] %x, f32[2] %y)
  %loop = {_OUTER} while({_OUTER} %init), condition=%outer_cond, body=%outer_body
  %a = f32[2] get-tuple-element({_OUTER} %loop), index=1
  %b = f32[2] get-tuple-element({_OUTER} %loop), index=2
  ROOT %t = (f32[2], f32[2]) tuple(f32[2] %a, f32[2] %b)""", f"""%inner_cond (ic.p: {_INNER}) -> pred[] {{
  %ic.p = {_INNER} parameter(0)
  %ic.j = s32[] get-tuple-element({_INNER} %ic.p), index=0
  %ic.n = s32[] constant(3)
  ROOT %ic.lt = pred[] compare(s32[] %ic.j, s32[] %ic.n), direction=LT
}}

%inner_body (ib.p: {_INNER}) -> {_INNER} {{
  %ib.p = {_INNER} parameter(0)
  %ib.j = s32[] get-tuple-element({_INNER} %ib.p), index=0
  %ib.ab = (f32[2], f32[2]) get-tuple-element({_INNER} %ib.p), index=1
  %ib.a = f32[2] get-tuple-element((f32[2], f32[2]) %ib.ab), index=0
  %ib.b = f32[2] get-tuple-element((f32[2], f32[2]) %ib.ab), index=1
  %ib.sum = f32[2] add(f32[2] %ib.a, f32[2] %ib.b)
  %ib.swapped = (f32[2], f32[2]) tuple(f32[2] %ib.b, f32[2] %ib.sum)
  %ib.one = s32[] constant(1)
  %ib.j2 = s32[] add(s32[] %ib.j, s32[] %ib.one)
  ROOT %ib.t = {_INNER} tuple(s32[] %ib.j2, (f32[2], f32[2]) %ib.swapped)
}}

%outer_cond (oc.p: {_OUTER}) -> pred[] {{
  %oc.p = {_OUTER} parameter(0)
  %oc.i = s32[] get-tuple-element({_OUTER} %oc.p), index=0
  %oc.n = s32[] constant(4)
  ROOT %oc.lt = pred[] compare(s32[] %oc.i, s32[] %oc.n), direction=LT
}}

%outer_body (ob.p: {_OUTER}) -> {_OUTER} {{
  %ob.p = {_OUTER} parameter(0)
  %ob.i = s32[] get-tuple-element({_OUTER} %ob.p), index=0
  %ob.a = f32[2] get-tuple-element({_OUTER} %ob.p), index=1
  %ob.b = f32[2] get-tuple-element({_OUTER} %ob.p), index=2
  %ob.ab = (f32[2], f32[2]) tuple(f32[2] %ob.b, f32[2] %ob.a)
  %ob.init = {_INNER} tuple(s32[] %ob.i, (f32[2], f32[2]) %ob.ab)
  %ob.inner = {_INNER} while({_INNER} %ob.init), condition=%inner_cond, body=%inner_body
  %ob.pair = (f32[2], f32[2]) get-tuple-element({_INNER} %ob.inner), index=1
  %ob.a2 = f32[2] get-tuple-element((f32[2], f32[2]) %ob.pair), index=0
  %ob.b2 = f32[2] get-tuple-element((f32[2], f32[2]) %ob.pair), index=1
  %ob.one = s32[] constant(1)
  %ob.i2 = s32[] add(s32[] %ob.i, s32[] %ob.one)
  ROOT %ob.t = {_OUTER} tuple(s32[] %ob.i2, f32[2] %ob.a2, f32[2] %ob.b2)
}}""")

# A loop whose body draws random bits from a loop-carried Philox state (key,
# counter) and sums them (as float) into an accumulator.
_RNG = "(s32[], u64[3], f32[4])"
RNG_LOOP = hlo(f"""  %key = u64[3] parameter(0)
  %zero = s32[] constant(0)
  %acc = f32[4] constant({{0, 0, 0, 0}})
  %init = {_RNG} tuple(s32[] %zero, u64[3] %key, f32[4] %acc)
  %loop = {_RNG} while({_RNG} %init), condition=%rc, body=%rb
  %s = u64[3] get-tuple-element({_RNG} %loop), index=1
  %total = f32[4] get-tuple-element({_RNG} %loop), index=2
  ROOT %t = (u64[3], f32[4]) tuple(u64[3] %s, f32[4] %total)""", f"""%rc (rc.p: {_RNG}) -> pred[] {{
  %rc.p = {_RNG} parameter(0)
  %rc.i = s32[] get-tuple-element({_RNG} %rc.p), index=0
  %rc.n = s32[] constant(3)
  ROOT %rc.lt = pred[] compare(s32[] %rc.i, s32[] %rc.n), direction=LT
}}

%rb (rb.p: {_RNG}) -> {_RNG} {{
  %rb.p = {_RNG} parameter(0)
  %rb.i = s32[] get-tuple-element({_RNG} %rb.p), index=0
  %rb.s = u64[3] get-tuple-element({_RNG} %rb.p), index=1
  %rb.acc = f32[4] get-tuple-element({_RNG} %rb.p), index=2
  %rb.g = (u64[3], u32[4]) rng-bit-generator(u64[3] %rb.s), algorithm=rng_philox
  %rb.s2 = u64[3] get-tuple-element((u64[3], u32[4]) %rb.g), index=0
  %rb.bits = u32[4] get-tuple-element((u64[3], u32[4]) %rb.g), index=1
  %rb.nine = u32[] constant(9)
  %rb.nines = u32[4] broadcast(u32[] %rb.nine), dimensions={{}}
  %rb.top = u32[4] shift-right-logical(u32[4] %rb.bits, u32[4] %rb.nines)
  %rb.f = f32[4] convert(u32[4] %rb.top)
  %rb.acc2 = f32[4] add(f32[4] %rb.acc, f32[4] %rb.f)
  %rb.one = s32[] constant(1)
  %rb.i2 = s32[] add(s32[] %rb.i, s32[] %rb.one)
  ROOT %rb.t = {_RNG} tuple(s32[] %rb.i2, u64[3] %rb.s2, f32[4] %rb.acc2)
}}""")

# A conditional on a pred, and one on an index (out of range: the last branch).
_BRANCHES = """%double (d.p: f32[3]) -> f32[3] {
  %d.p = f32[3] parameter(0)
  ROOT %d.r = f32[3] add(f32[3] %d.p, f32[3] %d.p)
}

%negate (n.p: f32[3]) -> f32[3] {
  %n.p = f32[3] parameter(0)
  ROOT %n.r = f32[3] negate(f32[3] %n.p)
}

%square (s.p: f32[3]) -> f32[3] {
  %s.p = f32[3] parameter(0)
  ROOT %s.r = f32[3] multiply(f32[3] %s.p, f32[3] %s.p)
}"""
PRED_CONDITIONAL = hlo("""  %p = pred[] parameter(0)
  %x = f32[3] parameter(1)
  ROOT %r = f32[3] conditional(pred[] %p, f32[3] %x, f32[3] %x), true_computation=%double, false_computation=%negate""",
                       _BRANCHES)
INDEX_CONDITIONAL = hlo("""  %k = s32[] parameter(0)
  %x = f32[3] parameter(1)
  ROOT %r = f32[3] conditional(s32[] %k, f32[3] %x, f32[3] %x, f32[3] %x), branch_computations={%double, %negate, %square}""",
                        _BRANCHES)

# A call of a computation that itself calls one.
CALLS = hlo("""  %x = f32[3] parameter(0)
  %c = f32[3] call(f32[3] %x), to_apply=%outer
  ROOT %r = f32[3] add(f32[3] %c, f32[3] %x)""", _BRANCHES + """

%outer (o.p: f32[3]) -> f32[3] {
  %o.p = f32[3] parameter(0)
  %o.d = f32[3] call(f32[3] %o.p), to_apply=%double
  ROOT %o.r = f32[3] call(f32[3] %o.d), to_apply=%square
}""")
