"""The repository stands on its own: nothing the tests, benchmarks, scripts or docs read lies outside it.

tests/conftest.py fails any test that opens a file beside the checkout while it runs; this module checks
what the code says before it runs: no path literal climbs above the checkout or points into another one,
no ``.parent`` chain or ``parents[N]`` climbs above the checkout's root, and every data path that
tests/paths.py names exists inside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests import paths
from tests.paths import REPO

CODE = sorted(p for folder in ("tests", "benchmarks", "scripts", "perfdoctor") for p in (REPO / folder).rglob("*.py"))
# Where checkouts and the project's shared folder live on the developers' machines: no code names them.
# (Other absolute paths are fine: system locations, and made-up ones such as a snapshot's stack frames.)
CHECKOUTS = ("/work/", "/home/", "/root/")
SHARED = ("/shared", "shared/traces", "shared/research", "shared/guide")  # "/shared": a folder beside the repo


def _climbs(path: Path, node: ast.AST) -> int | None:
    """How many folders above ``path``'s own folder ``node`` (a ``Path(__file__)...`` chain) reaches."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
        if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
            return node.slice.value
    depth = 0
    while isinstance(node, ast.Attribute) and node.attr == "parent":
        depth, node = depth + 1, node.value
    if depth and isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "resolve":
        return depth - 1
    return None


@pytest.mark.parametrize("path", CODE, ids=[str(p.relative_to(REPO)) for p in CODE])
def test_no_path_leaves_the_checkout(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    depth_of_file = len(path.relative_to(REPO).parts) - 1  # folders between the file and the root
    skip = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings say where data came from
    if path == Path(__file__):  # the patterns this module looks for
        skip |= {id(c) for n in tree.body if isinstance(n, ast.Assign) for c in ast.walk(n.value)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            text = node.value
            assert not text.startswith(CHECKOUTS), (path, node.lineno, text)
            assert not any(s in text for s in SHARED), (path, node.lineno, text)
        climbed = _climbs(path, node)
        if climbed is not None:
            assert climbed <= depth_of_file, f"{path}:{node.lineno} climbs {climbed} folders above the file"
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and isinstance(node.right, ast.Constant):
            if isinstance(node.left, ast.Attribute) and node.left.attr == "parent":
                owner = node.left.value
                assert not (isinstance(owner, ast.Name) and owner.id == "REPO"), f"{path}:{node.lineno}: REPO.parent"


def test_every_named_data_path_is_in_the_checkout() -> None:
    named = {k: v for k, v in vars(paths).items() if isinstance(v, Path)}
    assert {"TRACES", "RESEARCH", "GUIDE", "REAL_H100"} <= set(named)
    for name, value in named.items():
        assert value.resolve().is_relative_to(REPO), name
        assert value.exists(), f"{name}: {value} is missing"


def test_real_traces_carry_their_licences() -> None:
    """Every real trace committed for the tests has its licence beside it and a line in the README."""
    readme = (paths.TRACES / "README.md").read_text()
    for kind in ("nsys", "kineto", "memory"):
        folder = paths.TRACES / kind
        assert list(folder.glob("LICENSE*")), folder
        for trace in (p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("LICENSE")):
            assert trace.name in readme or trace.parent.name in readme, trace
