"""The package's layers point down only, and no modules import each other in a cycle.

From the bottom: errors, arrays and cancel (kerasjit imports nothing of
itself there), hlo, passes, kernels, the compile driver, backends, runtime, the
TensorFlow frontend, and the API on top (step, wrap, explain, capture, bench, report,
callbacks). A module may import its own layer and those below it."""
import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
LAYERS = [{"errors", "arrays", "cancel", "quiet_start"}, {"hlo"}, {"passes"}, {"kernels"}, {"compiler"}, {"backends"},
          {"runtime"}, {"frontend"},
          {"step", "step_identity", "wrap", "explain", "capture", "bench", "bench_suite", "bench_peer",
           "bench_startup", "bench_distribute", "workloads", "report", "callbacks", "__main__",
           "__init__"}]


def _modules():
    """Dotted name -> source path of every module of the package."""
    paths = {}
    for path in (ROOT / "kerasjit").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    for path in (ROOT / "callbacks").glob("*.py"):     # installed as kerasjit.callbacks
        paths["kerasjit.callbacks" + ("" if path.stem == "__init__" else f".{path.stem}")] = path
    return paths


MODULES = _modules()


def _imports(name, path, top_level_only):
    """The package's modules `name` imports (those it names, else their package)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level \
                else []
            target = ".".join(base + ([node.module] if node.module else []))
            named = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]
            yield from named or ([target] if target in MODULES else [])
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in MODULES)


def _layer(name):
    part = name.split(".")[1] if "." in name else "__init__"
    return next(i for i, layer in enumerate(LAYERS) if part in layer)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    upward = [target for target in _imports(name, MODULES[name], top_level_only=False)
              if _layer(target) > _layer(name)]
    assert not upward, f"{name} imports a higher layer: {upward}"


def test_no_import_cycle():
    graph = {name: set(_imports(name, path, top_level_only=True)) - {name}
             for name, path in MODULES.items()}
    state = {}      # name -> "open" while on the path, "done" after

    def visit(name, path):
        state[name] = "open"
        for target in sorted(graph[name]):
            assert state.get(target) != "open", f"import cycle: {' -> '.join(path + [target])}"
            if target not in state:
                visit(target, path + [target])
        state[name] = "done"
    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
