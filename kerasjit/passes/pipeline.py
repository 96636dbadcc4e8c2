"""Passes in a visible list (XLA's HloPassPipeline).

A pass is a function Module -> Module; the ones here mutate the module they are
given and return it. In debug mode the module is verified before the first pass
and after each one, and its signature (entry parameters, root shape, aliases)
must not change, so a broken pass is named where it broke the module. The text
can be dumped after chosen passes, to a directory or to a callback.
"""
import os

from ..hlo import HloVerifyError, print_module, verify
from .batch_sums import fold_batch_sums
from .constant_folding import constant_folding
from .cse import cse
from .dce import dce
from .dilated_convolutions import split_dilated_convolutions
from .dot_transposes import fold_dot_transposes
from .inlining import conditional_to_select, inline_calls
from .simplify import simplify
from .widen_floats import widen_floats
from .window_dims_last import window_dims_last
from ..errors import PassError


class Pipeline:
    """Run `passes` in order, the whole list again until the module stops
    changing, at most `max_rounds` times.

    dump_dir: None, a directory (files `NN-passname.hlo`, NN counting this
    pipeline's pass runs) or a callable(pass_name, hlo_text).
    dump_after: the pass names to dump after (None: all of them).
    """

    def __init__(self, passes, debug=False, dump_dir=None, dump_after=None, max_rounds=1):
        self.passes = list(passes)
        self.debug, self.dump_dir, self.dump_after = debug, dump_dir, dump_after
        self.max_rounds = max_rounds
        self.runs = 0

    def __call__(self, module):
        if self.debug:
            self._check(module, "the input module is invalid", None)
        before = print_module(module)
        for _ in range(self.max_rounds):
            for p in self.passes:
                signature = _signature(module)
                module = p(module)
                self.runs += 1
                if self.debug:
                    self._check(module, f"pass '{p.__name__}' broke the module", signature)
                self._dump(p.__name__, module)
            after = print_module(module)
            if after == before:
                break
            before = after
        return module

    def _check(self, module, problem, signature):
        try:
            verify(module)
        except HloVerifyError as e:
            raise PassError(f"{problem}: {e}") from e
        if signature is not None and _signature(module) != signature:
            raise PassError(f"{problem}: it changed the entry's parameters, result shape "
                            "or aliases")

    def _dump(self, name, module):
        if self.dump_dir is None or (self.dump_after is not None and name not in self.dump_after):
            return
        if callable(self.dump_dir):
            self.dump_dir(name, print_module(module))
            return
        os.makedirs(self.dump_dir, exist_ok=True)
        path = os.path.join(self.dump_dir, f"{self.runs - 1:02d}-{name}.hlo")
        with open(path, "w") as f:
            f.write(print_module(module))


def _signature(module):
    params = [(p.parameter_number, p.shape) for p in module.entry.parameters]
    return params, module.entry.root.shape, dict(module.input_output_alias)


DEFAULT_PASSES = (inline_calls, conditional_to_select, widen_floats, simplify, fold_dot_transposes,
                  split_dilated_convolutions, window_dims_last, constant_folding, fold_batch_sums,
                  cse, dce)


def configured_passes():
    """DEFAULT_PASSES less those KERASJIT_SKIP_PASSES names (comma-separated):
    a pass's effect measured by the same command with and without it. A
    skipped pass a backend needs (inline_calls, widen_floats: calls and 16-bit
    floats it does not generate code for) sends the cluster to TensorFlow."""
    skipped = {name.strip() for name in os.environ.get("KERASJIT_SKIP_PASSES", "").split(",")
               if name.strip()}
    known = [p.__name__ for p in DEFAULT_PASSES]
    unknown = sorted(skipped - set(known))
    if unknown:
        raise ValueError(f"KERASJIT_SKIP_PASSES names no pass {', '.join(unknown)}; "
                         f"the passes: {', '.join(known)}")
    return tuple(p for p in DEFAULT_PASSES if p.__name__ not in skipped)


def optimize(module, debug=False, dump_dir=None, dump_after=None, passes=DEFAULT_PASSES):
    """Calls and conditionals inlined, 16-bit floats computed in f32, simplify,
    transposes folded into dots, convolutions over dilated inputs split by
    phase, gathers' and scatters' window dims last, constant folding, batch
    sums folded into dots, CSE and DCE, repeated until nothing changes."""
    return Pipeline(passes, debug, dump_dir, dump_after, max_rounds=8)(module)


def optimize_as_configured(module):
    """optimize() with configured_passes(), verifying after every pass with
    KERASJIT_DEBUG=1 and dumping the module after each one to
    KERASJIT_DUMP_DIR when set (what a backend runs on a module it compiles)."""
    return optimize(module, debug=bool(os.environ.get("KERASJIT_DEBUG")),
                    dump_dir=os.environ.get("KERASJIT_DUMP_DIR"), passes=configured_passes())
