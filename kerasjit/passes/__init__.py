"""HLO optimisation passes: functions Module -> Module run by a Pipeline."""
from .constant_folding import constant_folding
from .cse import cse
from .dce import dce
from .pipeline import DEFAULT_PASSES, PassError, Pipeline, optimize, optimize_as_configured
from .simplify import simplify
from .util import replace_all_uses, rewrite

__all__ = ["constant_folding", "cse", "dce", "simplify", "DEFAULT_PASSES", "PassError",
           "Pipeline", "optimize", "optimize_as_configured", "replace_all_uses", "rewrite"]
