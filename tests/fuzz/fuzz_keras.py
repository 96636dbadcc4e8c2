"""Random small Keras models trained plain and through kerasjit, compared, with shrinking.

    python tests/fuzz/fuzz_keras.py --seed 0 --models 300 [--seconds N] [--start I] [--no-shrink]
                                    [--warm]

Model i of seed s is drawn from np.random.default_rng([s, i]) (`--start i
--models 1` replays it alone) and its data from a second generator seeded the
same way, inside the model's source: a spec is rendered as a Python script
(build(), the data, fit's arguments), and that script is what runs, so a
printed spec is the very program that failed.

Each model is built once for its initial weights; then a plain copy and a
`kerasjit.wrap(model, race=False)` copy (same seed before each build, same
weights) train on the same data, and their History (every key), variables
(the model's and the optimizer's), evaluate() and predict() are compared
(with --warm, the compared copy's steps are rebuilt, untraced, from the
recipes a first wrapped copy kept in a compile cache of its own):
  - within rtol RTOL / atol ATOL: float32 reassociation over a few steps
    of training stays near 1e-6, where a wrong gradient, update or mask
    shows at 1e-3 and more.
  - accuracy-like metrics count discrete decisions, which a prediction
    within tolerance of a decision boundary may flip: they may differ by the
    share of the weight of one sample and of the samples whose predictions
    from plain Keras are within tolerance of a tie or of 0.5 (a model whose
    outputs hardly depend on its inputs ties them all).
  - beyond that, a difference is still rounding when plain Keras itself moves
    as far under rounding: the same training from initial weights nudged by
    one ulp. kerasjit's largest difference in a quantity may be at most
    SENSITIVITY times plain Keras's own there (as test_keras_parity allows
    twice XLA's). Adam-like and sign-based (Lion) updates turn the rounding
    noise of a gradient that is mathematically zero (a bias before
    BatchNormalization) into learning-rate-sized steps, which this lets pass.
A model that plain Keras cannot build or train, or whose plain training is
not finite, is "invalid", not a failure.

Not drawn, for kerasjit bugs this fuzzer found:
  - the CosineSimilarity loss, UnitNormalization: keras.ops.normalize is
    x * minimum(rsqrt(sum(x**2)), 1 / epsilon); at a zero vector rsqrt is inf,
    and TensorFlow's RsqrtGrad (and SqrtGrad) give 0 where the incoming
    gradient is 0, XLA's lowering 0 * inf = NaN: the weights turn NaN where
    plain Keras trains on.
  - the selu activation: its gradient at exactly 0 (a zero bias on inputs
    that dropout, padding or a ReLU made zero) is scale * alpha through XLA's
    lowering of SeluGrad, and scale in TensorFlow's kernel.
"""
import argparse
import dataclasses
import os
import re
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import kerasjit  # noqa: E402

RTOL, ATOL = 1e-4, 1e-5
SENSITIVITY = 2
MODEL_SEED = 1234               # keras.utils.set_random_seed before every build
MAX_ELEMENTS = 1024             # per sample, in any layer's output: compiles stay quick


# ------------------------------------------------------------------ specs

@dataclass(frozen=True)
class Call:
    """A Keras constructor call, e.g. Call("layers.Dense", {"units": 4}); with
    `module` "", a call of a function the spec's source defines (SOURCE_FUNCTIONS)."""
    name: str
    kwargs: dict = dataclasses.field(default_factory=dict)
    module: str = "keras"

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.module + '.' if self.module else ''}{self.name}({args})"


# What a spec's source defines for its calls of module "": a Lambda layer's
# function iterating in a loop (keras.ops' fori_loop, while_loop) whose body
# reads the value the loop's state starts as.
SOURCE_FUNCTIONS = """
def iterated(steps=2, scale=0.5, loop="fori"):
    def step(h, x):
        return keras.ops.tanh(h + x) * scale

    def function(x):
        if loop == "fori":
            return keras.ops.fori_loop(0, steps, lambda i, h: step(h, x), x)
        return keras.ops.while_loop(lambda i, h: i < steps,
                                    lambda i, h: (i + 1, step(h, x)), (0, x))[1]
    return function
"""


@dataclass(frozen=True)
class Block:
    """A layer applied to x; with branches, a merge of them (each branch a chain
    of layers applied to x, an empty one x itself)."""
    layer: Call
    branches: tuple = ()


@dataclass(frozen=True)
class Spec:
    seed: int
    index: int
    input_shape: tuple
    vocab: int | None           # token inputs (int32) below vocab; else float32 inputs
    blocks: tuple               # of Block
    head: tuple                 # of Call: reducing layers, then the output layer
    target: str                 # what y holds: a key of TARGET_DATA
    target_shape: tuple         # y's shape per sample
    classes: int | None         # sparse labels are below this
    loss: Call
    metrics: tuple
    optimizer: Call
    batch_size: int
    batches: int                # full batches, then a partial one of `partial` rows
    partial: int
    epochs: int
    validation_split: float
    steps_per_execution: int
    sample_weights: bool
    class_weight: tuple | None  # a weight per class


TARGET_DATA = {
    "regression": "rng.normal(size={size}).astype('float32')",
    "positive": "rng.uniform(0.1, 2.0, size={size}).astype('float32')",
    "binary": "rng.integers(0, 2, size={size}).astype('float32')",
    "sparse": "rng.integers(0, {classes}, size={size})",
    "onehot": "np.eye({classes}, dtype='float32')[rng.integers(0, {classes}, size={size})]",
    "probabilities": "rng.dirichlet(np.ones({classes}), size={size}).astype('float32')",
}


def samples(spec):
    return spec.batch_size * spec.batches + spec.partial


def per_position(target, target_shape, **_):
    """Whether y holds a label per sequence position."""
    return len(target_shape) > (0 if target == "sparse" else 1)


def _block_lines(block):
    if not block.branches:
        return [f"x = {block.layer!r}(x)"]
    lines, names = [], []
    for i, branch in enumerate(block.branches):
        name = f"branch_{i}"
        lines.append(f"{name} = x")
        lines += [f"{name} = {layer!r}({name})" for layer in branch]
        names.append(name)
    # Keras's merge layers take a list; MultiHeadAttention takes (query, value).
    args = ", ".join(names) if block.layer.name == "layers.MultiHeadAttention" \
        else f"[{', '.join(names)}]"
    return lines + [f"x = {block.layer!r}({args})"]


def source(spec):
    """The spec as a script defining build(), the data, and fit_args."""
    n = samples(spec)
    dtype = ", dtype='int32'" if spec.vocab else ""
    body = [f"inputs = keras.Input(shape={spec.input_shape}{dtype})", "x = inputs"]
    for block in spec.blocks:
        body += _block_lines(block)
    body += [f"x = {layer!r}(x)" for layer in spec.head]
    compile_args = [f"optimizer={spec.optimizer!r}", f"loss={spec.loss!r}",
                    f"metrics={list(spec.metrics)!r}"]
    if spec.steps_per_execution > 1:
        compile_args.append(f"steps_per_execution={spec.steps_per_execution}")
    body += ["model = keras.Model(inputs, x)",
             f"model.compile({', '.join(compile_args)})", "return model"]
    x_data = f"rng.integers(0, {spec.vocab}, size={(n, *spec.input_shape)}).astype('int32')" \
        if spec.vocab else f"rng.normal(size={(n, *spec.input_shape)}).astype('float32')"
    one_hot = spec.target in ("onehot", "probabilities")
    y_size = (n, *spec.target_shape[:-1]) if one_hot else (n, *spec.target_shape)
    y_data = TARGET_DATA[spec.target].format(size=y_size, classes=spec.classes)
    fit_args = [f"batch_size={spec.batch_size}", f"epochs={spec.epochs}", "shuffle=False"]
    if spec.validation_split:
        fit_args.append(f"validation_split={spec.validation_split}")
    if spec.sample_weights:     # a weight per sample, or per position of a per-position target
        size = (n, spec.target_shape[0]) if per_position(spec.target, spec.target_shape) \
            else (n,)
        fit_args.append(f"sample_weight=rng.uniform(0.5, 2.0, size={size}).astype('float32')")
    if spec.class_weight:
        fit_args.append(f"class_weight={dict(enumerate(spec.class_weight))}")
    return "\n".join([
        f"# fuzz_keras: seed {spec.seed}, model {spec.index}",
        "import keras", "import numpy as np", "", SOURCE_FUNCTIONS, "",
        "def build():", *(f"    {line}" for line in body), "", "",
        f"rng = np.random.default_rng([{spec.seed}, {spec.index}])",
        f"x = {x_data}", f"y = {y_data}",
        f"fit_args = dict(x=x, y=y, {', '.join(fit_args)})", ""])


def repro(spec):
    """A standalone script that runs the spec's comparison and prints it."""
    return "\n".join([source(spec),
                      f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r})",
                      "from fuzz_keras import compare",
                      "print(compare(build, fit_args).describe())", ""])


# -------------------------------------------------------------- drawing

# Not "selu", for a kerasjit bug (see the module's docstring).
COMMON_ACTIVATIONS = ("relu", "gelu", "tanh", "sigmoid", "softmax", "elu", "swish", "softplus",
                      "leaky_relu", "linear")
RARE_ACTIVATIONS = ("softsign", "relu6", "hard_sigmoid", "hard_silu", "mish", "log_softmax",
                    "celu", "squareplus", "log_sigmoid", "hard_tanh", "sparse_plus",
                    "tanh_shrink", "sparsemax")


def pick(rng, options):
    return options[rng.integers(len(options))]


def chance(rng, p):
    return rng.random() < p


def activation(rng):
    return pick(rng, COMMON_ACTIVATIONS if chance(rng, 0.8) else RARE_ACTIVATIONS)


def _maybe(rng, kwargs, p, **options):
    """Add each option to kwargs with probability p (a pick when given a tuple)."""
    for key, value in options.items():
        if chance(rng, p):
            kwargs[key] = pick(rng, value) if isinstance(value, tuple) else value
    return kwargs


def _regularizer(rng):
    return pick(rng, (Call("regularizers.L2", {"l2": 1e-3}), Call("regularizers.L1", {"l1": 1e-4}),
                      Call("regularizers.L1L2", {"l1": 1e-4, "l2": 1e-3})))


def dense(rng, shape):
    kwargs = {"units": int(rng.integers(1, 17))}
    _maybe(rng, kwargs, 0.6, activation=activation(rng))
    _maybe(rng, kwargs, 0.15, use_bias=False, kernel_regularizer=_regularizer(rng),
           bias_regularizer=_regularizer(rng))
    return Call("layers.Dense", kwargs)


ELEMENTWISE = ("Dropout", "BatchNormalization", "LayerNormalization", "Activation", "LeakyReLU",
               "ReLU", "PReLU", "ELU", "Softmax", "Loop")
# Not drawn, for a kerasjit bug (see the module's docstring): UnitNormalization
# (the gradient at a zero vector).
RARE_ELEMENTWISE = ("AlphaDropout", "GaussianNoise", "GaussianDropout", "RMSNormalization",
                    "GroupNormalization", "ActivityRegularization", "Rescaling")


# Over a single value these leave only rounding noise times 1/sqrt(epsilon), which
# any reassociation (XLA's, kerasjit's fused multiply-adds) changes.
PER_SAMPLE_NORMALIZATIONS = ("LayerNormalization", "RMSNormalization", "GroupNormalization")


def elementwise(rng, shape):
    """A layer that keeps the shape: activations, normalizations, noise."""
    rank, channels = len(shape), shape[-1]
    kinds = ELEMENTWISE if chance(rng, 0.8) else RARE_ELEMENTWISE
    if channels == 1:
        kinds = tuple(k for k in kinds if k not in PER_SAMPLE_NORMALIZATIONS)
    kind = pick(rng, kinds)
    kwargs = {}
    if kind == "Dropout":
        kwargs["rate"] = pick(rng, (0.1, 0.25, 0.5))
        if rank > 1 and chance(rng, 0.25):     # one mask for every position
            kwargs["noise_shape"] = (None, *([1] * (rank - 1)), channels)
    elif kind in ("AlphaDropout", "GaussianDropout"):
        kwargs["rate"] = pick(rng, (0.1, 0.3))
    elif kind == "GaussianNoise":
        kwargs["stddev"] = pick(rng, (0.1, 0.5))
    elif kind == "BatchNormalization":
        _maybe(rng, kwargs, 0.3, momentum=(0.9, 0.5), epsilon=(1e-5, 0.1), center=False,
               scale=False)
    elif kind == "LayerNormalization":
        _maybe(rng, kwargs, 0.3, epsilon=(1e-6, 0.1), center=False, scale=False)
        if rank > 1 and chance(rng, 0.3):
            kwargs["axis"] = list(range(1, rank + 1))
    elif kind == "RMSNormalization":
        _maybe(rng, kwargs, 0.3, epsilon=(1e-6, 0.1))
    elif kind == "GroupNormalization":
        kwargs["groups"] = pick(rng, [g for g in (1, 2, 4) if channels % g == 0
                                      and (rank > 1 or channels > g)])
    elif kind == "Activation":
        kwargs["activation"] = activation(rng)
    elif kind == "LeakyReLU":
        _maybe(rng, kwargs, 0.5, negative_slope=(0.1, 0.01))
    elif kind == "PReLU":
        if rank > 1 and chance(rng, 0.4):
            kwargs["shared_axes"] = list(range(1, rank))
    elif kind == "ELU":
        _maybe(rng, kwargs, 0.5, alpha=(0.5, 2.0))
    elif kind == "ReLU":
        _maybe(rng, kwargs, 0.4, max_value=(1.0, 6.0), negative_slope=(0.1,),
               threshold=(0.2, -0.5))
    elif kind == "ActivityRegularization":
        kwargs = {"l1": 1e-3, "l2": 1e-3}
    elif kind == "Rescaling":
        kwargs = {"scale": pick(rng, (0.5, 2.0)), "offset": pick(rng, (0.0, -0.5))}
    elif kind == "Loop":
        return Call("layers.Lambda", {"function": Call("iterated", {
            "steps": int(rng.integers(1, 4)), "scale": pick(rng, (0.5, 0.9)),
            "loop": pick(rng, ("fori", "while"))}, module="")})
    return Call(f"layers.{kind}", kwargs)


def _conv_kwargs(rng, dims, filters=True):
    kwargs = {"filters": int(rng.integers(1, 9))} if filters else {}
    kernel = int(rng.integers(1, 4))
    kwargs["kernel_size"] = kernel if dims == 1 or chance(rng, 0.7) else \
        (kernel, int(rng.integers(1, 4)))
    dilated = chance(rng, 0.2)
    if dilated:
        kwargs["dilation_rate"] = 2         # (Keras allows no stride with a dilation)
    elif chance(rng, 0.35):
        kwargs["strides"] = pick(rng, (2, 3) if dims == 1 else (2, (1, 2), 3))
    _maybe(rng, kwargs, 0.5, padding=("same", "causal") if dims == 1 else ("same",))
    _maybe(rng, kwargs, 0.4, activation=activation(rng))
    _maybe(rng, kwargs, 0.1, use_bias=False)
    return kwargs


def _pool_kwargs(rng):
    size = int(rng.integers(2, 4))
    kwargs = {"pool_size": size}
    if chance(rng, 0.4):     # overlapping windows
        kwargs["strides"] = int(rng.integers(1, size))
    return _maybe(rng, kwargs, 0.4, padding="same")


def _conv_layer_kwargs(rng, kind, rank, channels):
    """Arguments of a convolution layer `kind` of `rank` spatial dims: grouped
    sometimes (Conv), a depth multiplier sometimes (Separable, Depthwise)."""
    kwargs = _conv_kwargs(rng, rank, filters=kind != f"DepthwiseConv{rank}D")
    if kind == f"Conv{rank}D" and chance(rng, 0.15) and channels % 2 == 0:
        kwargs["groups"], kwargs["filters"] = 2, 2 * int(rng.integers(1, 4))
    if kind in (f"SeparableConv{rank}D", f"DepthwiseConv{rank}D"):
        _maybe(rng, kwargs, 0.3, depth_multiplier=2)
    return kwargs


def sequence_layer(rng, shape):
    length, channels = shape
    kind = pick(rng, ("Conv1D", "Conv1D", "Conv1D", "SeparableConv1D", "DepthwiseConv1D",
                      "Conv1DTranspose", "MaxPooling1D", "AveragePooling1D",
                      "GlobalAveragePooling1D", "GlobalMaxPooling1D", "Flatten", "Cropping1D",
                      "ZeroPadding1D", "UpSampling1D", "Permute", "SpatialDropout1D",
                      "Reshape", "SimpleRNN", "LSTM", "GRU", "EinsumDense"))
    if kind in ("Conv1D", "SeparableConv1D", "Conv1DTranspose", "DepthwiseConv1D"):
        kwargs = _conv_layer_kwargs(rng, kind, 1, channels)
        if kind in ("Conv1DTranspose", "DepthwiseConv1D") and kwargs.get("padding") == "causal":
            del kwargs["padding"]         # (Conv1D's alone)
        return Call(f"layers.{kind}", kwargs)
    if kind in ("MaxPooling1D", "AveragePooling1D"):
        return Call(f"layers.{kind}", _pool_kwargs(rng))
    if kind in ("GlobalAveragePooling1D", "GlobalMaxPooling1D"):
        return Call(f"layers.{kind}", _maybe(rng, {}, 0.2, keepdims=True))
    if kind == "Cropping1D":
        return Call("layers.Cropping1D", {"cropping": (int(rng.integers(0, 2)), 1)})
    if kind == "ZeroPadding1D":
        return Call("layers.ZeroPadding1D", {"padding": int(rng.integers(1, 3))})
    if kind == "UpSampling1D":
        return Call("layers.UpSampling1D", {"size": 2})
    if kind == "Permute":
        return Call("layers.Permute", {"dims": (2, 1)})
    if kind == "SpatialDropout1D":
        return Call("layers.SpatialDropout1D", {"rate": pick(rng, (0.2, 0.5))})
    if kind == "Reshape":
        return Call("layers.Reshape", {"target_shape": (length * channels,)})
    if kind in ("SimpleRNN", "LSTM", "GRU"):
        return Call(f"layers.{kind}", _maybe(rng, {"units": int(rng.integers(1, 6))}, 0.5,
                                             return_sequences=True))
    return Call("layers.EinsumDense", {"equation": "abc,cd->abd",
                                       "output_shape": (None, int(rng.integers(1, 9))),
                                       **_maybe(rng, {}, 0.5, bias_axes="d")})


def image_layer(rng, shape):
    height, width, channels = shape
    kind = pick(rng, ("Conv2D", "Conv2D", "Conv2D", "DepthwiseConv2D", "SeparableConv2D",
                      "Conv2DTranspose", "MaxPooling2D", "MaxPooling2D", "AveragePooling2D",
                      "GlobalAveragePooling2D", "GlobalMaxPooling2D", "Flatten",
                      "UpSampling2D", "ZeroPadding2D", "Cropping2D", "SpatialDropout2D",
                      "Reshape", "Augmentation"))
    if kind == "Augmentation":
        return augmentation(rng, shape)
    if kind in ("Conv2D", "SeparableConv2D", "Conv2DTranspose", "DepthwiseConv2D"):
        kwargs = _conv_layer_kwargs(rng, kind, 2, channels)
        return Call(f"layers.{kind}", kwargs)
    if kind in ("MaxPooling2D", "AveragePooling2D"):
        return Call(f"layers.{kind}", _pool_kwargs(rng))
    if kind in ("GlobalAveragePooling2D", "GlobalMaxPooling2D"):
        return Call(f"layers.{kind}", _maybe(rng, {}, 0.2, keepdims=True))
    if kind == "UpSampling2D":
        return Call("layers.UpSampling2D", _maybe(rng, {"size": 2}, 0.4,
                                                  interpolation="bilinear"))
    if kind == "ZeroPadding2D":
        return Call("layers.ZeroPadding2D", {"padding": pick(rng, (1, ((0, 1), (1, 2))))})
    if kind == "Cropping2D":
        return Call("layers.Cropping2D", {"cropping": pick(rng, (1, ((0, 1), (1, 2))))})
    if kind == "SpatialDropout2D":
        return Call("layers.SpatialDropout2D", {"rate": pick(rng, (0.2, 0.5))})
    if kind == "Reshape":
        return Call("layers.Reshape", {"target_shape": (height * width, channels)})
    return Call(f"layers.{kind}")


# Keras's image augmentation layers: random in training (stateless draws from
# a seed variable), the identity in inference. The translation, rotation and
# zoom transform images with ImageProjectiveTransformV3, which has no XLA
# kernel: TensorFlow runs it between compiled clusters.
AUGMENTATIONS = ("RandomFlip", "RandomTranslation", "RandomRotation", "RandomZoom",
                 "RandomContrast", "RandomBrightness", "RandomCrop")


def augmentation(rng, shape):
    height, width, _ = shape
    kind = pick(rng, AUGMENTATIONS)
    if kind == "RandomFlip":
        return Call("layers.RandomFlip", {"mode": pick(rng, ("horizontal", "vertical",
                                                              "horizontal_and_vertical"))})
    if kind in ("RandomTranslation", "RandomZoom"):
        kwargs = {"height_factor": 0.2, "width_factor": pick(rng, (0.1, 0.3))}
        return Call(f"layers.{kind}", _maybe(rng, kwargs, 0.3, fill_mode="constant",
                                             interpolation="nearest"))
    if kind == "RandomRotation":
        return Call("layers.RandomRotation", _maybe(rng, {"factor": 0.1}, 0.3,
                                                    fill_mode="nearest"))
    if kind == "RandomContrast":
        return Call("layers.RandomContrast", {"factor": pick(rng, (0.2, 0.5))})
    if kind == "RandomBrightness":
        return Call("layers.RandomBrightness", {"factor": 0.2, "value_range": (-4, 4)})
    return Call("layers.RandomCrop", {"height": max(1, height - 1), "width": max(1, width - 1)})


def features_layer(rng, shape):
    (features,) = shape
    kind = pick(rng, ("RepeatVector", "Reshape"))
    if kind == "RepeatVector":
        return Call("layers.RepeatVector", {"n": int(rng.integers(2, 5))})
    divisors = [d for d in range(2, features) if features % d == 0] or [1]
    width = pick(rng, divisors)
    return Call("layers.Reshape", {"target_shape": (features // width, width)})


RANK_LAYERS = {1: features_layer, 2: sequence_layer, 3: image_layer}


def layer(rng, shape):
    """Any layer for an input of this shape (per sample)."""
    roll = rng.random()
    if roll < 0.35:
        return elementwise(rng, shape)
    if len(shape) == 1 and roll < 0.9 or len(shape) == 2 and roll < 0.55:
        return dense(rng, shape)
    return RANK_LAYERS[len(shape)](rng, shape)


def merge(rng, shape):
    kind = pick(rng, ("Add", "Add", "Concatenate", "Concatenate", "Multiply", "Subtract",
                      "Average", "Maximum", "Minimum")
                + (("Attention", "AdditiveAttention", "MultiHeadAttention")
                   if len(shape) == 2 else ()))
    kwargs = {}
    if kind == "MultiHeadAttention":
        kwargs = {"num_heads": int(rng.integers(1, 3)), "key_dim": int(rng.integers(2, 5))}
    elif kind == "Attention":
        _maybe(rng, kwargs, 0.3, use_scale=True, score_mode="concat")
    elif kind == "Concatenate" and len(shape) > 1 and chance(rng, 0.3):
        kwargs["axis"] = 1
    lengths = rng.integers(0, 3, size=2)
    if kind not in ("Attention", "AdditiveAttention", "MultiHeadAttention"):
        lengths[0] = max(lengths[0], 1)          # (not a merge of x with itself)
    branches = tuple(tuple(layer(rng, shape) for _ in range(n)) for n in lengths)
    return Block(Call(f"layers.{kind}", kwargs), branches)


def apply(block, x):
    """The block applied to a symbolic tensor (raises where Keras would)."""
    namespace = {"keras": keras, "x": x}
    exec(SOURCE_FUNCTIONS, namespace)
    exec("\n".join(_block_lines(block)), namespace)
    # Keras finds these only when the model runs:
    if block.layer.name in ("layers.Attention", "layers.AdditiveAttention") and \
            namespace["branch_0"].shape[-1] != namespace["branch_1"].shape[-1]:
        raise ValueError("attention of a query and a value of different widths")
    return namespace["x"]


def _size_ok(x):
    dims = x.shape[1:]
    return all(d is not None and d > 0 for d in dims) and np.prod(dims) <= MAX_ELEMENTS


def draw_blocks(rng, inputs, count):
    """`count` blocks, each redrawn until Keras accepts it on the running shape."""
    x, blocks = inputs, []
    for _ in range(count):
        for _attempt in range(20):
            shape = tuple(x.shape[1:])
            block = merge(rng, shape) if chance(rng, 0.15) else Block(layer(rng, shape))
            try:
                y = apply(block, x)
            except Exception:
                continue
            if _size_ok(y):
                x = y
                blocks.append(block)
                break
    return x, tuple(blocks)


def draw_objective(rng, shape):
    """The Spec's fields for what the model learns, given x's shape per sample."""
    each_position = len(shape) == 2 and chance(rng, 0.3)      # a label per sequence position
    target = pick(rng, ("regression", "regression", "positive", "binary", "binary", "sparse",
                        "sparse", "onehot", "probabilities"))
    units = int(rng.integers(1, 4))
    categorical = target in ("sparse", "onehot", "probabilities")
    classes = int(rng.integers(2, 6)) if categorical else 2     # (binary: two classes)
    logits = chance(rng, 0.4)
    if target == "regression":
        loss = pick(rng, (Call("losses.MeanSquaredError"), Call("losses.MeanAbsoluteError"),
                          Call("losses.Huber", {"delta": pick(rng, (1.0, 0.5))}),
                          Call("losses.LogCosh")))    # (not CosineSimilarity: a kerasjit bug)
        output = pick(rng, (None, "tanh"))
        metrics = ["mae", "mse", Call("metrics.RootMeanSquaredError"),
                   Call("metrics.LogCoshError"), Call("metrics.CosineSimilarity")]
    elif target == "positive":
        loss = pick(rng, (Call("losses.MeanSquaredLogarithmicError"), Call("losses.Poisson"),
                          Call("losses.MeanAbsolutePercentageError")))
        output = "softplus"
        metrics = ["msle", Call("metrics.Poisson"), Call("metrics.MeanAbsoluteError")]
    elif target == "binary":
        output = None if logits else "sigmoid"
        if chance(rng, 0.15):
            loss, output = pick(rng, (Call("losses.Hinge"), Call("losses.SquaredHinge"))), "tanh"
        elif chance(rng, 0.3):
            loss = Call("losses.BinaryFocalCrossentropy", _maybe(
                rng, {"from_logits": logits}, 0.4, gamma=(1.0, 3.0), apply_class_balancing=True))
        else:
            loss = Call("losses.BinaryCrossentropy", _maybe(
                rng, {"from_logits": logits}, 0.3, label_smoothing=0.1))
        metrics = ["accuracy", Call("metrics.BinaryAccuracy"),
                   Call("metrics.BinaryCrossentropy", {"from_logits": logits}),
                   Call("metrics.Hinge"), Call("metrics.SquaredHinge")]
    elif target == "sparse":
        units, output = classes, None if logits else "softmax"
        loss = Call("losses.SparseCategoricalCrossentropy", {"from_logits": logits})
        metrics = ["accuracy", Call("metrics.SparseCategoricalAccuracy"),
                   Call("metrics.SparseCategoricalCrossentropy", {"from_logits": logits})]
        if classes > 2:
            metrics.append(Call("metrics.SparseTopKCategoricalAccuracy", {"k": 2}))
    else:
        units, output = classes, None if logits else "softmax"
        if target == "probabilities":
            output, loss = "softmax", pick(rng, (Call("losses.KLDivergence"),
                                                 Call("losses.CategoricalCrossentropy")))
            metrics = [Call("metrics.KLDivergence"), Call("metrics.CategoricalCrossentropy")]
        else:
            loss = pick(rng, (
                Call("losses.CategoricalCrossentropy",
                     _maybe(rng, {"from_logits": logits}, 0.3, label_smoothing=0.1)),
                Call("losses.CategoricalFocalCrossentropy",
                     _maybe(rng, {"from_logits": logits}, 0.4, gamma=(1.0, 3.0))),
                Call("losses.CategoricalHinge")))
            metrics = ["accuracy", Call("metrics.CategoricalAccuracy"),
                       Call("metrics.CategoricalCrossentropy", {"from_logits": logits})]
            if classes > 2:
                metrics.append(Call("metrics.TopKCategoricalAccuracy", {"k": 2}))
    if chance(rng, 0.15):
        loss = replace(loss, kwargs={**loss.kwargs, "reduction": pick(rng, ("sum", "mean"))})
    chosen = tuple(metrics[i] for i in sorted(rng.choice(len(metrics), rng.integers(0, 3),
                                                         replace=False)))
    target_shape = (units,) if target != "sparse" else ()
    head = [Call("layers.Dense", {"units": units, "activation": output})]
    if each_position:
        target_shape = (shape[0], *target_shape)
    elif len(shape) > 1:
        pools = f"{len(shape) - 1}D"
        head.insert(0, pick(rng, (Call("layers.Flatten"),
                                  Call(f"layers.GlobalAveragePooling{pools}"),
                                  Call(f"layers.GlobalMaxPooling{pools}"))))
    return dict(target=target, target_shape=target_shape, classes=classes, loss=loss,
                metrics=chosen, head=tuple(head))


OPTIMIZERS = {   # name: (learning rates, options drawn each with probability 0.3)
    "SGD": ((0.01, 0.005), {"momentum": (0.9, 0.5)}),
    "Adam": ((1e-3, 5e-4), {"amsgrad": True, "beta_1": 0.8, "epsilon": 1e-4}),
    "AdamW": ((1e-3,), {"weight_decay": 0.01, "amsgrad": True}),
    "RMSprop": ((1e-3,), {"rho": 0.8, "momentum": 0.5, "centered": True}),
    "Adagrad": ((0.01,), {"initial_accumulator_value": 0.5}),
    "Adadelta": ((0.1, 1.0), {"rho": 0.9}),
    "Adamax": ((1e-3,), {"beta_1": 0.8}),
    "Nadam": ((1e-3,), {"beta_2": 0.99}),
    "Lion": ((1e-4,), {"beta_1": 0.95}),
    "Ftrl": ((0.01,), {"l1_regularization_strength": 0.01,
                       "l2_regularization_strength": 0.01, "beta": 0.5}),
    "Lamb": ((1e-3,), {}),
    "Adafactor": ((1e-3,), {"relative_step": False}),
}
COMMON_OPTIMIZERS = ("SGD", "SGD", "Adam", "Adam", "AdamW", "RMSprop")


def learning_rate_schedule(rng, rate):
    return pick(rng, (
        Call("optimizers.schedules.ExponentialDecay",
             {"initial_learning_rate": rate, "decay_steps": 2, "decay_rate": 0.8}),
        Call("optimizers.schedules.CosineDecay",
             {"initial_learning_rate": rate, "decay_steps": 6, "warmup_steps": 2,
              "warmup_target": 2 * rate} if chance(rng, 0.5) else
             {"initial_learning_rate": rate, "decay_steps": 6}),
        Call("optimizers.schedules.PiecewiseConstantDecay",
             {"boundaries": [3], "values": [rate, rate / 2]}),
        Call("optimizers.schedules.InverseTimeDecay",
             {"initial_learning_rate": rate, "decay_steps": 2, "decay_rate": 0.5})))


def draw_optimizer(rng, sparse_gradients):
    name = pick(rng, COMMON_OPTIMIZERS if chance(rng, 0.5) else tuple(OPTIMIZERS))
    rates, options = OPTIMIZERS[name]
    rate = pick(rng, rates)
    kwargs = {"learning_rate": learning_rate_schedule(rng, rate) if chance(rng, 0.15) else rate}
    _maybe(rng, kwargs, 0.3, **options)
    if kwargs.get("momentum") and name == "SGD":
        _maybe(rng, kwargs, 0.5, nesterov=True)
    clipping = pick(rng, (None, None, None, "clipnorm", "clipvalue", "global_clipnorm"))
    if clipping:
        kwargs[clipping] = pick(rng, (0.1, 1.0))
    if name != "AdamW":
        _maybe(rng, kwargs, 0.08, weight_decay=0.01)
    _maybe(rng, kwargs, 0.08, use_ema=True)
    if kwargs.get("use_ema"):
        _maybe(rng, kwargs, 0.5, ema_momentum=0.5, ema_overwrite_frequency=2)
    _maybe(rng, kwargs, 0.08, gradient_accumulation_steps=2)
    if not sparse_gradients:      # (Keras cannot scale an Embedding's IndexedSlices gradient)
        _maybe(rng, kwargs, 0.05, loss_scale_factor=128.0)
    return Call(f"optimizers.{name}", kwargs)


def draw(seed, index):
    """Model `index` of `seed`."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # (Keras's, on layers that drop a mask)
        return _draw(np.random.default_rng([seed, index]), seed, index)


def _draw(rng, seed, index):
    keras.backend.clear_session()
    kind = pick(rng, ("features", "tokens", "sequence", "image"))
    vocab = None
    blocks = ()
    if kind == "features":
        shape = (int(rng.integers(2, 17)),)
    elif kind == "sequence":
        shape = (int(rng.integers(3, 13)), int(rng.integers(1, 7)))
    elif kind == "image":
        shape = (8, 8, int(rng.integers(1, 4)))
    else:
        shape, vocab = (int(rng.integers(3, 13)),), int(pick(rng, (10, 20, 50)))
        embedding = {"input_dim": vocab, "output_dim": int(rng.integers(2, 9))}
        blocks = (Block(Call("layers.Embedding", _maybe(rng, embedding, 0.2, mask_zero=True))),)
    inputs = keras.Input(shape=shape, dtype="int32" if vocab else "float32")
    x = apply(blocks[0], inputs) if blocks else inputs
    x, drawn = draw_blocks(rng, x, int(rng.integers(1, 5)))
    objective = draw_objective(rng, tuple(x.shape[1:]))
    batch_size = int(pick(rng, (4, 8, 16, 32)))
    # Keras reads class weights from a label per sample; it takes them or sample weights.
    labelled = objective["target"] in ("sparse", "onehot") or \
        objective["target"] == "binary" and objective["target_shape"] == (1,)
    weighting = pick(rng, ("none", "none", "none", "sample") + (
        ("class",) if labelled and not per_position(**objective) else ()))
    return Spec(
        seed=seed, index=index, input_shape=shape, vocab=vocab, blocks=blocks + drawn,
        **objective, optimizer=draw_optimizer(rng, sparse_gradients=bool(vocab)),
        batch_size=batch_size, batches=int(rng.integers(2, 5)),
        partial=int(rng.integers(1, batch_size)) if chance(rng, 0.4) else 0,
        epochs=int(rng.integers(1, 3)), validation_split=0.25 if chance(rng, 0.3) else 0.0,
        steps_per_execution=2 if chance(rng, 0.25) else 1,
        sample_weights=weighting == "sample",
        class_weight=tuple(float(pick(rng, (0.5, 1.0, 2.0))) for _ in range(objective["classes"]))
        if weighting == "class" else None)


# ------------------------------------------------------------- comparing

@dataclass
class Trained:
    history: dict
    variables: dict             # name: array, the model's then the optimizer's
    evaluation: dict
    prediction: np.ndarray


@dataclass
class Outcome:
    kind: str                   # "match", "mismatch", "error" (kerasjit raised), "invalid"
    details: list = dataclasses.field(default_factory=list)
    fallbacks: list = dataclasses.field(default_factory=list)   # kerasjit's warnings
    excused: list = dataclasses.field(default_factory=list)     # differences plain Keras has too

    def describe(self):
        lines = [self.kind, *self.details]
        lines += [f"(as far as plain Keras under rounding) {e}" for e in self.excused]
        return "\n".join(lines + [f"warning: {f}" for f in self.fallbacks])


def default_wrap(model):
    return kerasjit.wrap(model, race=False)


def train(build, fit_args, initial, wrap=None):
    keras.backend.clear_session()        # (the same variable paths in every copy)
    keras.utils.set_random_seed(MODEL_SEED)
    model = build()
    model.set_weights(initial)
    if wrap:
        model = wrap(model)
    history = model.fit(**fit_args, verbose=0).history
    data = dict(x=fit_args["x"], y=fit_args["y"], sample_weight=fit_args.get("sample_weight"),
                batch_size=fit_args["batch_size"], verbose=0)
    evaluation = model.evaluate(**data, return_dict=True)
    prediction = model.predict(data["x"], batch_size=data["batch_size"], verbose=0)
    # By position: a path may repeat (Adafactor's slots), and an optimizer built ahead of
    # the first step (as kerasjit does) leaves some of them out of its scope.
    variables = {f"weights[{i}] {v.path}": np.array(v) for i, v in enumerate(model.weights)}
    variables.update({f"optimizer[{i}] {v.name}": np.array(v)
                      for i, v in enumerate(model.optimizer.variables)})
    return Trained(history, variables, evaluation, prediction)


def quantities(trained):
    """Every compared quantity by name: (value, whether it counts discrete decisions)."""
    found = {f"history[{key!r}]": (np.array(values), "accuracy" in key)
             for key, values in trained.history.items()}
    found.update({f"evaluate[{key!r}]": (np.array(value), "accuracy" in key)
                  for key, value in trained.evaluation.items()})
    found.update({name: (value, False) for name, value in trained.variables.items()})
    found["predict"] = (trained.prediction, False)
    return found


def _sample_weights(fit_args):
    """A weight per sample: its sample weight (averaged over positions) times its class's."""
    y = np.asarray(fit_args["y"])
    weights = np.asarray(fit_args.get("sample_weight", np.ones(len(y))), np.float64)
    weights = weights.reshape(len(y), -1).mean(axis=1)      # (a weight per position)
    if fit_args.get("class_weight"):      # (labels per sample: sparse, one-hot or one unit)
        labels = y.argmax(-1) if y.ndim > 1 and y.shape[-1] > 1 else y.reshape(len(y))
        weights = weights * np.vectorize(fit_args["class_weight"].get)(labels.astype(int))
    return weights


def _undecided(prediction):
    """Per sample, whether a prediction within tolerance of plain Keras's could
    decide otherwise: its top two outputs, or an output and 0.5, that close."""
    p = prediction.reshape(len(prediction), -1, prediction.shape[-1]).astype(np.float64)
    tolerance = ATOL + RTOL * np.abs(p)
    at_threshold = np.abs(p - 0.5) <= tolerance
    top = np.sort(p, axis=-1)
    tied = top[..., -1:] - top[..., -2:-1] <= 2 * tolerance.max(axis=-1, keepdims=True) \
        if p.shape[-1] > 1 else np.zeros_like(at_threshold)
    return (at_threshold.any(axis=-1) | tied.any(axis=-1)).any(axis=-1)


def _decision_share(fit_args, prediction):
    """How much a metric counting decisions may move: the weight of one sample and of
    the samples plain Keras leaves undecided, over the total of the smallest set it is
    computed on (the validation set, when there is one)."""
    weights = _sample_weights(fit_args)
    split = fit_args.get("validation_split", 0)
    smallest = weights[int(len(weights) * (1 - split)):] if split else weights
    return (weights.max() + weights[_undecided(prediction)].sum()) / smallest.sum()


def _gap(actual, expected):
    """|actual - expected|, where NaN matches only NaN."""
    gap = np.abs(actual.astype(np.float64) - expected)
    return np.where(np.isnan(actual) & np.isnan(expected), 0, np.nan_to_num(gap, nan=np.inf))


def differences(plain, jit, fit_args):
    """{name: (largest difference, description)} of the quantities beyond tolerance."""
    share = _decision_share(fit_args, plain.prediction)
    ours = quantities(jit)
    found = {}
    for name, (expected, discrete) in quantities(plain).items():
        actual = ours.get(name, (None,))[0]
        if actual is None or actual.shape != expected.shape or actual.dtype != expected.dtype:
            found[name] = (np.inf, f"{name}: {actual!r} where plain Keras has {expected!r}")
        elif not np.issubdtype(expected.dtype, np.floating):
            if not np.array_equal(actual, expected):
                found[name] = (np.inf, f"{name}: {actual} where plain Keras has {expected}")
        else:
            gap = _gap(actual, expected)
            allowed = share * 1.0001 if discrete else ATOL + RTOL * np.abs(expected)
            if np.any(gap > allowed):
                worst = np.argmax(gap)
                found[name] = (float(gap.max()), f"{name}: differs by {gap.max():.3g} (plain "
                               f"{expected.flat[worst]:.7g}, kerasjit {actual.flat[worst]:.7g})")
    return found


def _nudged(weights):
    """Every nonzero float weight moved by one ulp."""
    return [np.where(w == 0, w, np.nextafter(w, np.inf)) if np.issubdtype(w.dtype, np.floating)
            else w for w in weights]


def compare(build, fit_args, wrap=default_wrap):
    """Train plain and wrapped copies of build() and compare them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            keras.backend.clear_session()
            keras.utils.set_random_seed(MODEL_SEED)
            initial = build().get_weights()
            plain = train(build, fit_args, initial)
        except Exception as e:
            return Outcome("invalid", [f"plain Keras: {type(e).__name__}: {str(e)[:300]}"])
    if not all(np.all(np.isfinite(v)) for v in plain.history.values()):
        return Outcome("invalid", ["plain Keras's training is not finite"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            jit = train(build, fit_args, initial, wrap)
        except Exception:
            jit, error = None, traceback.format_exc(limit=-4)
    fallbacks = sorted({str(w.message) for w in caught if str(w.message).startswith("kerasjit")})
    if jit is None:
        return Outcome("error", [error], fallbacks)
    found = differences(plain, jit, fit_args)
    excused = []
    if found:                 # is plain Keras as sensitive there?
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            nudged = quantities(train(build, fit_args, _nudged(initial)))
        reference = quantities(plain)
        for name, (gap, detail) in list(found.items()):
            own = _gap(nudged[name][0], reference[name][0]).max() if gap < np.inf else 0
            if gap <= SENSITIVITY * own:
                del found[name]
                excused.append(f"{detail}; plain Keras moves {own:.3g}")
    return Outcome("mismatch" if found else "match", [d for _, d in found.values()], fallbacks,
                   excused)


def check(spec, wrap=default_wrap):
    namespace = {}
    exec(source(spec), namespace)
    return compare(namespace["build"], namespace["fit_args"], wrap)


def check_warm(spec):
    """check() of warm starts: a first wrapped copy trains in a compile cache
    of its own, which keeps its steps' recipes; the compared copy (the same
    names: train() clears the session) rebuilds its steps from them,
    untraced. Returns the Outcome and the names of the steps rebuilt so."""
    namespace = {}
    exec(source(spec), namespace)
    build, fit_args = namespace["build"], namespace["fit_args"]
    wrapped = []

    def wrap(model):
        wrapped.append(default_wrap(model))
        return wrapped[-1]
    kept = os.environ.get("KERASJIT_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="kerasjit-fuzz-") as cache:
        os.environ["KERASJIT_CACHE_DIR"] = cache
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    keras.backend.clear_session()
                    keras.utils.set_random_seed(MODEL_SEED)
                    train(build, fit_args, build().get_weights(), default_wrap)
                except Exception:
                    pass            # (the compared copy meets it again and says so)
            outcome = compare(build, fit_args, wrap)
        finally:
            if kept is None:
                del os.environ["KERASJIT_CACHE_DIR"]
            else:
                os.environ["KERASJIT_CACHE_DIR"] = kept
    rebuilt = [what.split(":")[0] for model in wrapped[-1:]
               for _, _, what, *_ in model._kerasjit.compile_events
               if "rebuilt from the compile cache" in what]
    return outcome, rebuilt


# ------------------------------------------------------------- shrinking

def _without(kwargs, key):
    return {k: v for k, v in kwargs.items() if k != key}


def _simpler_calls(call):
    """The call without one of its arguments, or with a nested call simplified."""
    for key, value in call.kwargs.items():
        yield replace(call, kwargs=_without(call.kwargs, key))
        if isinstance(value, Call):
            for simpler in _simpler_calls(value):
                yield replace(call, kwargs={**call.kwargs, key: simpler})


def _simpler_blocks(blocks):
    for i, block in enumerate(blocks):
        rest = blocks[:i], blocks[i + 1:]
        yield rest[0] + rest[1]
        for b, branch in enumerate(block.branches):
            yield rest[0] + tuple(Block(layer) for layer in branch) + rest[1]
            for j in range(len(branch)):
                branches = list(block.branches)
                branches[b] = branch[:j] + branch[j + 1:]
                yield rest[0] + (replace(block, branches=tuple(branches)),) + rest[1]
    for i, block in enumerate(blocks):
        for layer in _simpler_calls(block.layer):
            yield blocks[:i] + (replace(block, layer=layer),) + blocks[i + 1:]
        for b, branch in enumerate(block.branches):
            for j, layer in enumerate(branch):
                for simpler in _simpler_calls(layer):
                    branches = list(block.branches)
                    branches[b] = branch[:j] + (simpler,) + branch[j + 1:]
                    yield blocks[:i] + (replace(block, branches=tuple(branches)),) + blocks[i + 1:]


def simplifications(spec):
    """Smaller variants of the spec, the biggest cuts first."""
    for blocks in _simpler_blocks(spec.blocks):
        yield replace(spec, blocks=blocks)
    for i in range(len(spec.head) - 1):          # (the output layer stays)
        yield replace(spec, head=spec.head[:i] + spec.head[i + 1:])
    if spec.epochs > 1:
        yield replace(spec, epochs=1)
    if spec.batches > 1:
        yield replace(spec, batches=spec.batches - 1)
    if spec.partial:
        yield replace(spec, partial=0)
    for field, plain in (("validation_split", 0.0), ("steps_per_execution", 1),
                         ("sample_weights", False), ("class_weight", None)):
        if getattr(spec, field) != plain:
            yield replace(spec, **{field: plain})
    for i in range(len(spec.metrics)):
        yield replace(spec, metrics=spec.metrics[:i] + spec.metrics[i + 1:])
    rate = spec.optimizer.kwargs.get("learning_rate", 0.01)
    if spec.optimizer.name != "optimizers.SGD" or len(spec.optimizer.kwargs) > 1:
        yield replace(spec, optimizer=Call("optimizers.SGD", {"learning_rate": rate}))
    for optimizer in _simpler_calls(spec.optimizer):
        yield replace(spec, optimizer=optimizer)
    for loss in _simpler_calls(spec.loss):
        yield replace(spec, loss=loss)
    for i, head_layer in enumerate(spec.head):
        for simpler in _simpler_calls(head_layer):
            yield replace(spec, head=spec.head[:i] + (simpler,) + spec.head[i + 1:])
    if spec.batch_size > 2:
        yield replace(spec, batch_size=spec.batch_size // 2,
                      partial=min(spec.partial, spec.batch_size // 2 - 1))


def shrink(spec, fails):
    """The smallest variant reached by taking the first simplification that still
    fails, until none does."""
    while True:
        for candidate in simplifications(spec):
            if fails(candidate):
                spec = candidate
                break
        else:
            return spec


def same_failure(outcome, checked=check):
    """A predicate: whether a spec fails as `outcome` did (an error of the same type)."""
    def error_type(o):
        return o.details[0].strip().splitlines()[-1].split(":")[0] if o.kind == "error" else ""

    def fails(spec):
        candidate = checked(spec)
        return candidate.kind == outcome.kind and error_type(candidate) == error_type(outcome)
    return fails


# ------------------------------------------------------------------ runs

@dataclass
class Summary:
    seed: int
    run: int = 0
    invalid: int = 0
    failures: list = dataclasses.field(default_factory=list)    # (index, outcome, shrunk spec)
    fallbacks: dict = dataclasses.field(default_factory=dict)   # warning pattern: models
    seconds: float = 0.0

    def line(self):
        return (f"seed {self.seed}: {self.run} models run in {self.seconds:.0f} s, "
                f"{self.invalid} invalid, {len(self.failures)} failures"
                + (f" (models {', '.join(str(i) for i, _, _ in self.failures)})"
                   if self.failures else ""))


def _pattern(message):
    return re.sub(r"\d+", "N", message.split("\n")[0])[:160]


def _warm_outcome(spec):
    return check_warm(spec)[0]


def fuzz(seed, models, start=0, seconds=None, shrinking=True, out=print, warm=False):
    """`warm`: each model's compared copy starts from the recipes of a first one."""
    checked = _warm_outcome if warm else check
    summary = Summary(seed)
    began = time.perf_counter()
    for index in range(start, start + models):
        if seconds is not None and time.perf_counter() - began > seconds:
            break
        spec = draw(seed, index)
        model_began = time.perf_counter()
        outcome = checked(spec)
        summary.run += 1
        for message in outcome.fallbacks:
            summary.fallbacks[_pattern(message)] = summary.fallbacks.get(_pattern(message), 0) + 1
        took = time.perf_counter() - model_began
        out(f"model {index}: {outcome.kind} ({took:.1f} s)"
            + "".join(f"\n    {line}" for line in outcome.describe().splitlines()[1:]))
        if outcome.kind == "invalid":
            summary.invalid += 1
        elif outcome.kind != "match":
            shrunk = shrink(spec, same_failure(outcome, checked)) if shrinking else spec
            if shrunk != spec:
                out(f"shrunk: {checked(shrunk).describe()}")
            out(f"seed {seed}, model {index}, {'shrunk ' if shrinking else ''}spec:\n"
                f"{repro(shrunk)}")
            summary.failures.append((index, outcome, shrunk))
    summary.seconds = time.perf_counter() - began
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", type=int, default=300)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--seconds", type=float, default=None,
                        help="start no model after this long")
    parser.add_argument("--no-shrink", action="store_true")
    parser.add_argument("--warm", action="store_true",
                        help="compare warm starts: steps rebuilt from a first copy's recipes")
    args = parser.parse_args(argv)
    tf.get_logger().setLevel("ERROR")      # (its notes on Keras's retracing, once per model)
    summary = fuzz(args.seed, args.models, args.start, args.seconds, not args.no_shrink,
                   out=lambda s: print(s, flush=True), warm=args.warm)
    for pattern, count in sorted(summary.fallbacks.items(), key=lambda kv: -kv[1]):
        print(f"fallback in {count} models: {pattern}")
    print(summary.line())
    return 1 if summary.failures else 0


if __name__ == "__main__":
    sys.exit(main())
