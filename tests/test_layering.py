"""Imports follow the data flow (docs/pipeline.md): data -> retrieval -> train -> eval -> export,
over a shared layer (ratune/: errors, I/O, config, the name registry, manifests, the model loader
ratune/models.py) that imports no stage, under the drivers (the CLI, the demo, sweeps) that import
them all. Every import counts, module-level or inside a function."""

from __future__ import annotations

import ast

import pytest

from source_tree import PACKAGE_DIRS, ROOT, source_files

#: Rank of each stage package: a module may import its own rank or lower ones (written out by hand).
#: catalog/ is the data stage for a user's own APIs.
STAGE_RANK = {"data": 1, "catalog": 1, "retrieval": 2, "train": 3, "eval": 4, "export": 5}
#: The drivers, above every stage.
DRIVERS = ("ratune.cli", "ratune.demo", "ratune.sweep")
#: The two edges the data flow allows against the ranks, each with its reason.
ALLOWED = {
    # DESIGN's "retrieval -> data (chats)": the chat builder puts retrieved documents into chats
    ("ratune.data.build", "ratune.retrieval.retrievers"),
    # `python -m ratune.train` runs behind the one error boundary of every ratune command
    ("ratune.train.__main__", "ratune.cli"),
}


def _packages() -> dict[str, str]:
    """``{folder: package}`` from pyproject.toml's package-dir (data -> ratune.data, ...)."""
    import tomllib

    table = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-dir"]
    return {folder: package for package, folder in table.items()}


_PACKAGES = _packages()


def _module_name(path) -> str:
    """ratune.eval.scoring.parse for eval/scoring/parse.py; a package's ``__init__`` is the package."""
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [*_PACKAGES[folder].split("."), *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """``{module: {imported ratune module}}`` for every source file of the package folders."""
    graph = {}
    for path in source_files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and n.level == 0}
        names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        graph[_module_name(path)] = {n for n in names if n == "ratune" or n.startswith("ratune.")}
    return graph


def rank(module: str) -> int:
    """0 for the shared layer, a stage's rank, 9 for a driver."""
    if module.startswith(DRIVERS):
        return 9
    parts = module.split(".")
    return STAGE_RANK.get(parts[1], 0) if len(parts) > 1 else 0


GRAPH = _imports()


def test_the_graph_covers_every_stage_and_the_shared_layer():
    assert {"ratune.data.build", "ratune.retrieval.bm25", "ratune.train.sft", "ratune.eval.run",
            "ratune.export.checkpoint", "ratune.models", "ratune.catalog.instruct", "ratune.sweep.cells"} <= set(GRAPH)
    assert set(PACKAGE_DIRS) == {"ratune", "data", "catalog", "retrieval", "train", "eval", "export"}
    assert rank("ratune.models") == 0 and rank("ratune.sweep.cells") == 9 and rank("ratune.eval.scoring.parse") == 4


def test_no_module_imports_a_later_stage():
    backward = sorted((m, n) for m, names in GRAPH.items() for n in names
                      if rank(n) > rank(m) and (m, n) not in ALLOWED)
    assert backward == []


def test_the_allowed_edges_still_exist():
    """An exception nobody needs any more is removed from ALLOWED, not kept as a loophole."""
    assert all(target in GRAPH[source] for source, target in ALLOWED)


def test_the_module_graph_has_no_cycle():
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(module, stack):
        state[module] = 1
        for target in sorted(GRAPH.get(module, ())):
            target = target if target in GRAPH else next((m for m in GRAPH if target.startswith(m + ".")), target)
            if state.get(target) == 1:
                pytest.fail("import cycle: " + " -> ".join([*stack, module, target]))
            if target in GRAPH and state.get(target) is None:
                visit(target, [*stack, module])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [])


def test_a_planted_backward_import_is_found():
    """The check is not vacuous: the model loader importing a stage is caught."""
    planted = dict(GRAPH, **{"ratune.models": GRAPH["ratune.models"] | {"ratune.data.prompt"}})
    assert [(m, n) for m, names in planted.items() for n in names
            if rank(n) > rank(m) and (m, n) not in ALLOWED] == [("ratune.models", "ratune.data.prompt")]
