"""HLO optimisation passes: functions Module -> Module run by a Pipeline."""
from .batch_sums import fold_batch_sums
from .constant_folding import constant_folding
from .cse import cse
from .dce import dce
from .dilated_convolutions import split_dilated_convolutions
from .dot_transposes import fold_dot_transposes
from .inlining import conditional_to_select, inline_calls
from .pipeline import (DEFAULT_PASSES, PassError, Pipeline, configured_passes, optimize,
                       optimize_as_configured)
from .simplify import simplify
from .util import replace_all_uses, rewrite
from .widen_floats import widen_floats
from .window_dims_last import window_dims_last

__all__ = ["DEFAULT_PASSES", "PassError", "Pipeline", "conditional_to_select", "configured_passes",
           "constant_folding", "cse", "dce", "fold_batch_sums", "fold_dot_transposes",
           "inline_calls", "optimize", "optimize_as_configured", "replace_all_uses", "rewrite",
           "simplify", "split_dilated_convolutions", "widen_floats", "window_dims_last"]
