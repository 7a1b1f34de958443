"""Imports follow the data flow (docs/pipeline.md): sources -> catalog -> hubs -> retrieval -> data
(the chat builder) -> train -> eval -> export, over a shared layer (ratune/: errors, I/O, config, the name registry, manifests, the model loader
ratune/models.py) that imports no stage, under the drivers (the CLI, the demo, sweeps) that import
them all. Every import counts, module-level or inside a function."""

from __future__ import annotations

import ast


from source_tree import PACKAGE_DIRS, PACKAGES, ROOT, source_files

#: Rank of each stage folder: a module may import its own rank or lower ones (written out by hand).
#: sources/ (APIBench parsing, the row format, leakage rules) and hubs/ (the kinds of hub, over
#: catalog/) come before retrieval, which the chat builder in data/ uses.
STAGE_RANK = {"sources": 1, "catalog": 2, "hubs": 3, "retrieval": 4, "data": 5, "train": 6, "eval": 7, "export": 8}
#: The drivers, above every stage.
DRIVERS = ("ratune.cli", "ratune.demo", "ratune.sweep")
#: Edges the data flow allows against the ranks, each with its reason: none.
ALLOWED: set[tuple[str, str]] = set()


def _module_name(path) -> str:
    """ratune.eval.scoring.parse for eval/scoring/parse.py; a package's ``__init__`` is the package."""
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [*PACKAGES[folder].split("."), *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """``{module: {imported ratune module}}`` for every source file of the package folders; for
    ``from ratune.x import y`` both ``ratune.x`` and, when ``y`` is a module, ``ratune.x.y``."""
    paths = source_files()
    modules = {_module_name(path) for path in paths}
    graph = {}
    for path in paths:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
                names |= {f"{node.module}.{a.name}" for a in node.names} & modules
            elif isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
        graph[_module_name(path)] = {n for n in names if n == "ratune" or n.startswith("ratune.")}
    return graph


def rank(module: str) -> int:
    """0 for the shared layer, a stage's rank, 9 for a driver."""
    if any(module == d or module.startswith(d + ".") for d in DRIVERS):
        return 9
    parts = module.split(".")
    return STAGE_RANK.get(parts[1], 0) if len(parts) > 1 else 0


def backward_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports of a later stage (or a driver) that ALLOWED does not name, sorted."""
    return sorted((m, n) for m, names in graph.items() for n in names if rank(n) > rank(m) and (m, n) not in ALLOWED)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, modules in name order)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def owner(target):  # an imported name that is not a module of ours: the longest module it starts with
        return target if target in graph else max((m for m in graph if target.startswith(m + ".")), key=len,
                                                  default=None)

    def visit(module, stack):
        state[module] = 1
        for target in sorted(filter(None, map(owner, graph[module]))):
            if state.get(target) == 1:
                return [*stack, module, target]
            if state.get(target) is None:
                found = visit(target, [*stack, module])
                if found:
                    return found
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            found = visit(module, [])
            if found:
                return found[found.index(found[-1]):]
    return None


GRAPH = _imports()


def test_the_graph_covers_every_stage_and_the_shared_layer():
    assert {"ratune.data.build", "ratune.retrieval.bm25", "ratune.train.sft", "ratune.eval.run",
            "ratune.export.checkpoint", "ratune.models", "ratune.catalog.instruct", "ratune.sweep.cells"} <= set(GRAPH)
    assert set(PACKAGE_DIRS) == {"ratune", "sources", "catalog", "hubs", "data", "retrieval", "train", "eval", "export"}
    assert set(PACKAGE_DIRS) - {"ratune"} == set(STAGE_RANK)  # every stage folder has its rank
    assert rank("ratune.models") == 0 and rank("ratune.sweep.cells") == 9 and rank("ratune.eval.scoring.parse") == 7
    assert rank("ratune.client") == 0  # a name that merely starts like a driver's is not one
    # `from ratune.train import checks` is an import of the module ratune.train.checks
    assert "ratune.train.checks" in GRAPH["ratune.train.sft"]


def test_no_module_imports_a_later_stage():
    assert backward_edges(GRAPH) == []


def test_one_rank_per_folder_and_no_cycle_between_stage_folders():
    """Each stage folder has a rank of its own, so an import between two stage folders always goes
    down: no cycle can run between folders (data/hubs <-> catalog/ ran before hubs/ had a rank)."""
    assert len(set(STAGE_RANK.values())) == len(STAGE_RANK)
    folders = {(m.split(".")[1], n.split(".")[1]) for m, names in GRAPH.items() for n in names
               if rank(m) in STAGE_RANK.values() and rank(n) in STAGE_RANK.values()}
    assert all(STAGE_RANK[b] < STAGE_RANK[a] for a, b in folders if a != b)


def test_the_allowed_edges_still_exist():
    """An exception nobody needs any more is removed from ALLOWED, not kept as a loophole."""
    assert all(target in GRAPH[source] for source, target in ALLOWED)


def test_the_module_graph_has_no_cycle():
    assert find_cycle(GRAPH) is None


def test_a_planted_backward_import_and_a_planted_cycle_are_found():
    """The checks are not vacuous: the model loader importing a stage is caught, and so is the
    eval run importing the learning curve, which imports it."""
    planted = dict(GRAPH, **{"ratune.models": GRAPH["ratune.models"] | {"ratune.sources.prompt"}})
    assert backward_edges(planted) == [("ratune.models", "ratune.sources.prompt")]
    assert "ratune.eval.run" in GRAPH["ratune.eval.curve"]
    cyclic = dict(GRAPH, **{"ratune.eval.run": GRAPH["ratune.eval.run"] | {"ratune.eval.curve"}})
    cycle = find_cycle(cyclic)  # where the search enters the cycle depends on the other modules
    assert len(cycle) == 3 and cycle[0] == cycle[-1] and set(cycle) == {"ratune.eval.curve", "ratune.eval.run"}
