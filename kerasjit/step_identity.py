"""What defines a Keras model's traced steps, told without tracing them.

A model of Keras's own classes (a Functional or Sequential model of built-in
layers, compiled with built-in losses, metrics and optimizer, its steps
Keras's own) traces to a step that its configs, its variables and the
versions of the libraries decide. Their text is the model's step identity:
a warm start that finds a step kept under it in the compile cache runs that
step without TensorFlow's trace (seconds for a large CNN). A model with
anything of the user's own (a subclass, a Lambda layer, a loss function, a
learning-rate schedule) has none: only its trace can tell what it computes.
"""
import functools
import hashlib
import json
import re
import types
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf
from keras.src.layers.core.lambda_layer import Lambda
from keras.src.models.functional import Functional

# Where code is pinned by the versions the identity holds.
_LIBRARIES = ("keras.src.", "tensorflow.", "numpy.", "builtins")
# What decides a model's steps besides its layers; wrap sets none of them.
_STEP_METHODS = ("train_step", "test_step", "predict_step", "call", "compute_loss",
                 "_compute_loss", "compute_metrics", "__call__")


class StepIdentity(NamedTuple):
    text: str           # configs, variables and versions: equal text, equal steps
    variables: list     # the tf.Variables a step may capture, in a fixed order


def _library(module):
    return (module or "").startswith(_LIBRARIES)


def _user_code(value):
    """Whether `value` is code of the user's own: a function or method from
    outside the libraries, or a callable object of a class from outside them."""
    if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return not _library(getattr(getattr(value, "__func__", value), "__module__", None))
    if isinstance(value, functools.partial):
        return _user_code(value.func)
    return callable(value) and not isinstance(value, type) \
        and not _library(type(value).__module__)


def _leaves(value):
    """A value, or the elements of a list, tuple, set or dict's values."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    if isinstance(value, dict):
        return value.values()
    return (value,)


def _runs_user_code(obj):
    """Whether `obj` (a layer, loss, metric or optimizer) is of a class from
    outside the libraries or holds code of the user's own (a Dense layer's
    activation, a metric's function, a regularizer or learning-rate schedule
    of the user's class): its config would name such code, not its body.
    (Layers within layers are walked on their own.)"""
    return not _library(type(obj).__module__) or any(
        _user_code(leaf) for value in vars(obj).values() for leaf in _leaves(value))


def _held_values(obj):
    """A digest of each tensor or array `obj` holds outside variables (an
    adapted Normalization's mean and variance): a trace takes them in as
    constants, and no config shows them."""
    held = []
    for name, value in sorted(vars(obj).items()):
        for i, leaf in enumerate(_leaves(value)):
            if not isinstance(leaf, (np.ndarray, tf.Tensor)):     # (variables are no tensors)
                continue
            array = np.asarray(leaf)
            held.append((name, i, array.shape, array.dtype.str,
                         hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()))
    return held


def _plain_state(obj):
    """`obj`'s attributes that hold plain data, sorted by name: what its
    config may leave out (an optimizer's variables excluded from weight
    decay, a layer's setting changed after it was made)."""
    def plain(value):
        if isinstance(value, re.Pattern):
            return value.pattern
        if value is None or isinstance(value, (str, bool, int, float)):
            return value
        if isinstance(value, (list, tuple, set, frozenset)):
            items = [plain(v) for v in value]
            return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items) else \
                sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
        return _NOT_PLAIN
    state = {name: plain(value) for name, value in sorted(vars(obj).items())}
    return {name: value for name, value in state.items() if value is not _NOT_PLAIN}


_NOT_PLAIN = object()


def _config_text(obj):
    # (repr of what JSON cannot hold may show an address: a miss, never a wrong hit)
    return json.dumps(obj, sort_keys=True, default=repr)


def step_identity(model):
    """The model's StepIdentity, or None where its steps may hold code of
    the user's own (or a distribution strategy's), or Keras cannot tell its
    configs."""
    try:
        return _identity(model)
    except Exception:       # (a model this cannot read has no identity: it is traced)
        return None


def _names_user_code(arguments):
    """Whether compile's arguments (losses and metrics as names, functions or
    objects, in lists and dicts) hold code of the user's own."""
    if isinstance(arguments, (list, tuple, dict)):
        return any(map(_names_user_code, _leaves(arguments)))
    if arguments is None or isinstance(arguments, (str, bool, int, float)):
        return False
    return _user_code(arguments) if isinstance(arguments, types.FunctionType) \
        else _runs_user_code(arguments)


def _identity(model):
    if type(model) not in (Functional, keras.Sequential) or model.optimizer is None \
            or any(name in vars(model) for name in _STEP_METHODS) \
            or tf.distribute.has_strategy():
        return None
    operations = list(model._flatten_layers(include_self=False)) + list(
        getattr(model, "operations", ()))
    if any(isinstance(op, Lambda) or not type(op).__module__.startswith("keras.src.")
           or _runs_user_code(op) for op in operations):
        return None
    optimizers = [model.optimizer, *filter(None, [getattr(model.optimizer, "inner_optimizer",
                                                          None)])]
    if _names_user_code(list(model._compile_config.config.values())) \
            or any(map(_runs_user_code, optimizers)):
        return None
    variables = list({id(v): v for v in [*model.variables, *model.optimizer.variables,
                                         *model.metrics_variables]}.values())
    text = _config_text([
        type(model).__name__, model.get_config(), model.get_compile_config(),
        [(_plain_state(op), _held_values(op)) for op in operations],
        [(o.get_config(), _plain_state(o)) for o in optimizers],
        [(v.path, tuple(v.shape), v.dtype, v.trainable) for v in variables],
        [keras.config.floatx(), keras.config.epsilon(), keras.config.image_data_format(),
         keras.config.dtype_policy().name],
        [keras.__version__, tf.__version__, np.__version__]])
    return StepIdentity(text, [v.value for v in variables])
