"""kerasjit: compile Keras train steps through HLO, falling back to TensorFlow per cluster.

    model = kerasjit.wrap(model)      # then model.fit(...) as usual
"""
from .explain import explain, jit
from .wrap import wrap

__version__ = "0.1.0"
__all__ = ["wrap", "jit", "explain"]
