"""Print the house figures of docs/development.md: long functions, long modules, prose share.

    python bench/house_figures.py [--max-function 80] [--max-module 500]

Reads the package folders from pyproject.toml's ``package-dir``. A function's length is its
``def`` line through its last line (decorators excluded); prose is docstring lines plus comment
tokens, over all lines. A figure to read, not a gate: it exits 0 whatever it prints.
"""

from __future__ import annotations

import argparse
import ast
import io
import tokenize
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_dirs(root: Path = ROOT) -> list[Path]:
    """The package folders pyproject.toml maps, sorted."""
    config = tomllib.loads((root / "pyproject.toml").read_text())
    return sorted({root / d for d in config["tool"]["setuptools"]["package-dir"].values()})


def _docstring_lines(tree: ast.AST) -> int:
    total = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                total += first.end_lineno - first.lineno + 1
    return total


def _comment_lines(source: str) -> int:
    return sum(tok.type == tokenize.COMMENT
               for tok in tokenize.generate_tokens(io.StringIO(source).readline))


def module_figures(path: Path) -> dict:
    """Lines, docstring lines, comment lines and ``(name, line, length)`` of each function."""
    source = path.read_text()
    tree = ast.parse(source)
    functions = [(node.name, node.lineno, node.end_lineno - node.lineno + 1)
                 for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {"lines": len(source.splitlines()), "docstrings": _docstring_lines(tree),
            "comments": _comment_lines(source), "functions": functions}


def _share(part: int, whole: int) -> str:
    return f"{100 * part / max(whole, 1):.1f} %"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-function", type=int, default=80, help="lines (default 80)")
    parser.add_argument("--max-module", type=int, default=500, help="lines (default 500)")
    args = parser.parse_args(argv)
    figures = {path: module_figures(path) for folder in package_dirs()
               for path in sorted(folder.glob("*.py")) + sorted(folder.glob("*/*.py"))}
    figures = dict(sorted(figures.items()))
    lines = sum(f["lines"] for f in figures.values())
    docstrings = sum(f["docstrings"] for f in figures.values())
    comments = sum(f["comments"] for f in figures.values())
    print(f"package source: {lines} lines in {len(figures)} modules; docstrings {docstrings} "
          f"({_share(docstrings, lines)}), comments {comments} ({_share(comments, lines)}), "
          f"prose {_share(docstrings + comments, lines)}")
    print("\nprose share by folder:")
    for folder in package_dirs():
        inside = [f for p, f in figures.items() if folder in p.parents]
        total = sum(f["lines"] for f in inside)
        print(f"  {folder.name + '/':12} {total:6} lines  "
              f"{_share(sum(f['docstrings'] + f['comments'] for f in inside), total)}")
    long_functions = [(p, name, line, n) for p, f in figures.items()
                      for name, line, n in f["functions"] if n > args.max_function]
    print(f"\nfunctions over {args.max_function} lines: {len(long_functions)}")
    for path, name, line, n in sorted(long_functions, key=lambda x: -x[3]):
        print(f"  {n:4}  {path.relative_to(ROOT)}:{line} {name}")
    long_modules = [(p, f["lines"]) for p, f in figures.items() if f["lines"] > args.max_module]
    print(f"\nmodules over {args.max_module} lines: {len(long_modules)}")
    for path, n in sorted(long_modules, key=lambda x: -x[1]):
        print(f"  {n:4}  {path.relative_to(ROOT)}")
    recipe = [n for name, _, n in figures.get(ROOT / "train" / "sft.py", {"functions": []})["functions"]
              if name == "train"]
    print(f"\ntrain/sft.py train(): {recipe[0] if recipe else 'absent'} lines")


if __name__ == "__main__":
    main()
