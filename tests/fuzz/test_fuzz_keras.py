"""The Keras fuzzer (fuzz_keras.py): a fixed run of random models trains through
kerasjit as in plain Keras, a planted bug is caught, and a failure shrinks to
what it needs."""
from dataclasses import replace

import keras
import pytest

import kerasjit

from tests.fuzz import fuzz_keras
from tests.fuzz.fuzz_keras import Block, Call, Spec

pytestmark = pytest.mark.tensorflow_reference

SEED, MODELS = 1, 24        # about 90 s on two cores

BATCH_NORMALIZATION = Call("layers.BatchNormalization", {"momentum": 0.9})
SPEC = Spec(
    seed=0, index=0, input_shape=(6,), vocab=None,
    blocks=(Block(Call("layers.Dense", {"units": 8, "activation": "relu"})),
            Block(BATCH_NORMALIZATION),
            Block(Call("layers.Add"), ((Call("layers.Dropout", {"rate": 0.25}),), ()))),
    head=(Call("layers.Dense", {"units": 3, "activation": "softmax"}),),
    target="sparse", target_shape=(), classes=3,
    loss=Call("losses.SparseCategoricalCrossentropy", {"from_logits": False}),
    metrics=("accuracy", Call("metrics.SparseCategoricalCrossentropy")),
    optimizer=Call("optimizers.Adam", {"learning_rate": 1e-3, "amsgrad": True}),
    batch_size=8, batches=3, partial=2, epochs=2, validation_split=0.25,
    steps_per_execution=2, sample_weights=True, class_weight=None)


def test_random_models_train_as_in_plain_keras():
    summary = fuzz_keras.fuzz(SEED, MODELS, shrinking=False, out=lambda line: None)
    assert summary.run == MODELS
    assert summary.invalid <= MODELS // 5, "the generator should draw valid models"
    assert not summary.failures, "\n\n".join(
        f"{outcome.describe()}\n(shrink it: python tests/fuzz/fuzz_keras.py --seed {SEED} "
        f"--start {index} --models 1)\n{fuzz_keras.repro(spec)}"
        for index, outcome, spec in summary.failures)


WARM_MODELS = 8


def test_random_models_rebuilt_from_their_recipes_train_as_in_plain_keras():
    """Warm starts untraced: each model's steps rebuilt from the recipes a
    first copy kept (where its model has a step identity) train as plain
    Keras does."""
    rebuilt = 0
    for index in range(WARM_MODELS):
        outcome, steps = fuzz_keras.check_warm(fuzz_keras.draw(SEED, index))
        assert outcome.kind in ("match", "invalid"), \
            f"{outcome.describe()}\n{fuzz_keras.repro(fuzz_keras.draw(SEED, index))}"
        rebuilt += "train_step" in steps
    assert rebuilt >= WARM_MODELS // 2, "most drawn models have a step identity"


def test_the_run_draws_loops():
    """Some of the run's models hold a Lambda layer iterating in a loop whose
    body reads the value its state starts as (keras.ops' fori_loop and
    while_loop)."""
    loops = [fuzz_keras.source(fuzz_keras.draw(SEED, i)).split("def build")[1]
             for i in range(MODELS)]
    assert any("iterated(" in s for s in loops)


def _bn_momentum_wrong(model):
    """A planted bug: kerasjit training BatchNormalization with another momentum."""
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.8
    return kerasjit.wrap(model, race=False)


def test_comparison_catches_a_planted_bug():
    assert fuzz_keras.check(SPEC).kind == "match"
    outcome = fuzz_keras.check(SPEC, wrap=_bn_momentum_wrong)
    assert outcome.kind == "mismatch"
    assert any("moving_mean" in line for line in outcome.details), outcome.details


def test_shrinker_keeps_only_what_a_planted_failure_needs():
    def fails(spec):     # planted: whenever the model builds and has that BatchNormalization
        namespace = {}
        exec(fuzz_keras.source(spec), namespace)
        try:
            namespace["build"]()
        except Exception:
            return False
        return any(block.layer == BATCH_NORMALIZATION for block in spec.blocks)

    shrunk = fuzz_keras.shrink(SPEC, fails)
    assert shrunk.blocks == (Block(BATCH_NORMALIZATION),)
    assert shrunk == replace(
        SPEC, blocks=shrunk.blocks, head=(Call("layers.Dense", {"units": 3}),),
        loss=Call("losses.SparseCategoricalCrossentropy"), metrics=(),
        optimizer=Call("optimizers.SGD"), batch_size=2, batches=1, partial=0, epochs=1,
        validation_split=0.0, steps_per_execution=1, sample_weights=False)
    compile(fuzz_keras.repro(shrunk), "repro", "exec")
