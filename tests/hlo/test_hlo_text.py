"""The HLO TensorFlow emits for real train steps: parse, print back, evaluate.

Round trip: parse -> print -> parse gives the same module. Oracle: the numpy
evaluator run on that HLO matches TensorFlow executing the same HLO with XLA
(logs and every updated variable, via the module's input/output aliases).
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

from kerasjit import workloads
from kerasjit.frontend.bridge import literals_from_proto
from kerasjit.hlo import parse_module, print_module, verify
from kerasjit.hlo.evaluator import evaluate

MODELS = {
    "mlp_dropout": (workloads.mlp, (784,), 10),
    "conv_bn": (workloads.conv_bn, (28, 28, 1), 10),
    "elephant_cnn": (lambda: workloads.elephant_cnn(image_size=40), (40, 40, 3), 1),
    "softmax_regression": (workloads.softmax_regression, (784,), 10),
}


def structure(module):
    return [[(i.name, i.opcode, str(i.shape), [o.name for o in i.operands],
              sorted(i.attrs), None if i.literal is None else i.literal.tolist())
             for i in c.instructions] for c in module.computations]


@pytest.fixture(scope="module", params=list(MODELS))
def train_step_hlo(request):
    build, shape, classes = MODELS[request.param]
    keras.utils.set_random_seed(0)
    model = build()
    x, y = workloads.classification_data(8, shape, classes)
    x, y = tf.constant(x), tf.constant(y)
    step = tf.function(lambda x, y: model.train_step((x, y)), jit_compile=True)
    ir = step.experimental_get_compiler_ir(x, y)
    text, constants = ir(stage="hlo"), literals_from_proto(ir(stage="hlo_serialized"))
    concrete = step.get_concrete_function(x, y)
    by_handle = {id(v.handle): v for v in concrete.graph.variables}
    variables = [by_handle[id(h)] for h in concrete.captured_inputs]
    return text, constants, step, x, y, variables


def test_real_dump_round_trips(train_step_hlo):
    text, constants = train_step_hlo[:2]
    module = verify(parse_module(text, constants))
    printed = print_module(module)
    again = verify(parse_module(printed))
    assert structure(again) == structure(module)
    assert again.input_output_alias == module.input_output_alias
    assert print_module(again) == printed
    assert len(module.entry.instructions) == text.split("ENTRY")[1].count(" = ")


def test_evaluator_matches_tensorflow_on_real_dump(train_step_hlo):
    text, constants, step, x, y, variables = train_step_hlo
    module = parse_module(text, constants)
    before = [v.numpy() for v in variables]
    ours = evaluate(module, [x.numpy(), y.numpy(), *before])
    logs = tf.nest.flatten(step(x, y))
    after = [v.numpy() for v in variables]
    for i, value in enumerate(logs):
        np.testing.assert_allclose(ours[i], value.numpy(), rtol=1e-4, atol=1e-5)
    assert module.input_output_alias
    for (out,), (param, _) in module.input_output_alias.items():
        np.testing.assert_allclose(ours[out], after[param - 2], rtol=1e-4, atol=1e-5,
                                   err_msg=f"variable {variables[param - 2].name}")


def test_bridge_fetches_elided_constants_only_when_there_are_some(monkeypatch):
    """A large constant is printed `{...}`: its values come from the serialized
    module. Without one, TensorFlow's bridge runs once, for the text alone."""
    from kerasjit.frontend import bridge
    fetched = []
    real = bridge.literals_from_proto
    monkeypatch.setattr(bridge, "literals_from_proto",
                        lambda serialized: fetched.append(1) or real(serialized))
    table = np.arange(1000, dtype=np.float32)
    x = tf.constant(np.ones(1000, np.float32))
    module = bridge.hlo_module(lambda x: x * tf.constant(table), x)
    assert fetched
    np.testing.assert_array_equal(evaluate(module, [x.numpy()]), table)
    fetched.clear()
    small = bridge.hlo_module(lambda x: x * 2.0, x)
    assert not fetched
    np.testing.assert_array_equal(evaluate(small, [x.numpy()]), 2 * x.numpy())


def test_parser_reads_quotes_braces_and_spaces_and_names_its_errors():
    from kerasjit.hlo.parser import HloParseError
    text = """HloModule m
ENTRY %e (x: f32[2, 3]) -> f32[2,3] {
  %x = f32[2, 3]{1,0} parameter(0), metadata={op_name="a{b}\\"c}" source_file="f.py"}
  ROOT %n = f32[2,3]{1,0} negate(f32[2,3]{1,0} %x), metadata={op_type="Neg"}
}
"""
    module = parse_module(text)
    assert module.entry.root.opcode == "negate"
    assert module.entry.parameters[0].shape.dims == (2, 3)
    with pytest.raises(HloParseError, match="dynamic dimensions"):
        parse_module(text.replace("f32[2, 3]{1,0}", "f32[<=2,3]"))
    with pytest.raises(HloParseError, match="unbalanced"):      # the text cut short
        parse_module(text[:text.index('"Neg"}')])
    with pytest.raises(HloParseError, match="unknown element type 'f31'"):
        parse_module(text.replace("f32[2, 3]{1,0}", "f31[2,3]"))


def test_dim_labels_are_parsed_once_into_positions_and_print_back():
    module = parse_module("""HloModule c
ENTRY %e (x: f32[2,5,6,3], k: f32[3,3,3,4]) -> f32[2,3,4,4] {
  %x = f32[2,5,6,3] parameter(0)
  %k = f32[3,3,3,4] parameter(1)
  ROOT %c = f32[2,3,4,4] convolution(f32[2,5,6,3] %x, f32[3,3,3,4] %k), window={size=3x3}, dim_labels=b01f_01io->b01f
}
""")
    labels = module.entry.root.attrs["dim_labels"]
    assert labels.positions() == ({"b": 0, 0: 1, 1: 2, "f": 3}, {0: 0, 1: 1, "i": 2, "o": 3},
                                  {"b": 0, 0: 1, 1: 2, "f": 3})
    assert "dim_labels=b01f_01io->b01f" in print_module(module)


def test_an_array_constant_printed_with_its_rows_numbered_parses():
    # (XLA numbers a large array's rows in comments)
    module = parse_module("""HloModule m
ENTRY %e () -> f32[2,3] {
  ROOT %c = f32[2,3] constant({ /*i0=0*/ {1, 2, 3}, /*i0=1*/ {4, 5.5, -6} })
}
""")
    np.testing.assert_array_equal(module.entry.root.literal, [[1, 2, 3], [4, 5.5, -6]])
