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
import json
import types
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf
from keras.src.layers.core.lambda_layer import Lambda
from keras.src.models.functional import Functional

_KERAS = "keras.src."
# What decides a model's steps besides its layers; wrap sets none of them.
_STEP_METHODS = ("train_step", "test_step", "predict_step", "call", "compute_loss",
                 "_compute_loss", "compute_metrics", "__call__")


class StepIdentity(NamedTuple):
    text: str           # configs, variables and versions: equal text, equal steps
    variables: list     # the tf.Variables a step may capture, in a fixed order


def _keras_own(obj):
    """Whether `obj` (a loss, metric, optimizer, schedule or layer, maybe a
    function) is Keras's own, down to the functions it wraps."""
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return True
    if isinstance(obj, (list, tuple)):
        return all(map(_keras_own, obj))
    if isinstance(obj, dict):
        return all(map(_keras_own, obj.values()))
    if isinstance(obj, types.FunctionType):
        return obj.__module__.startswith(_KERAS) and "<" not in obj.__qualname__
    if isinstance(obj, keras.Variable):
        return True
    return type(obj).__module__.startswith(_KERAS) \
        and _keras_own(getattr(obj, "fn", None)) \
        and all(_keras_own(getattr(obj, name, None))
                for name in ("_learning_rate", "inner_optimizer"))


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


def _identity(model):
    if type(model) not in (Functional, keras.Sequential) or model.optimizer is None \
            or any(name in vars(model) for name in _STEP_METHODS) \
            or tf.distribute.has_strategy():
        return None
    operations = list(model._flatten_layers(include_self=False)) + list(
        getattr(model, "operations", ()))
    if not all(type(op).__module__.startswith(_KERAS) and not isinstance(op, Lambda)
               for op in operations):
        return None
    compile_config = model._compile_config.config
    if not _keras_own(list(compile_config.values())) or not _keras_own(model.optimizer):
        return None
    variables = list({id(v): v for v in [*model.variables, *model.optimizer.variables,
                                         *model.metrics_variables]}.values())
    text = _config_text([
        type(model).__name__, model.get_config(), model.get_compile_config(),
        model.optimizer.get_config(),
        [(v.path, tuple(v.shape), v.dtype, v.trainable) for v in variables],
        [keras.config.floatx(), keras.config.epsilon(), keras.config.image_data_format(),
         keras.config.dtype_policy().name],
        [keras.__version__, tf.__version__, np.__version__]])
    return StepIdentity(text, [v.value for v in variables])
