"""The dependency arrow points one way: gateway -> engine, never back."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_engine_never_imports_gateway():
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "engine").rglob("*.py") if "gateway" in imported_modules(p)]
    assert offenders == []


def test_gateway_uses_only_the_engine_public_interface():
    for path in (ROOT / "gateway").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("engine."):
                assert node.module in ("engine.interface",), f"{path}: imports {node.module}"
