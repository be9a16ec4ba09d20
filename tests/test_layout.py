"""The dependency arrows point one way (docs/architecture.md, "Layers"):

- engine never imports gateway;
- the gateway uses only the engine's public surface: `engine`, `engine.interface`, `engine.textnorm`;
- serving code (engine/ but engine/train/ and engine/bench.py, and gateway/) never reaches
  engine.train, however it is written: `from engine.train import x`, `import engine.train`,
  `from . import train`, `import engine` and then `engine.train`, or importlib;
- tests never import bench/, and bench/ takes from tests/ only tests/kit/;
- the gateway's domain core (gateway/dialog.py) is plain data: no storage, network or audio;
  responders take it from there, never from the session stores;
- the HTTP edge (gateway/app.py) sits on top: the registry, metrics and the rest never import it;
- the gateway never reads an engine's `.runtime`: engine.interface.Engine is the whole contract.

Static: the source is parsed, never imported, so a module's imports inside functions count too.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE_PUBLIC = {"engine", "engine.interface", "engine.textnorm"}
OFFLINE = ("engine/train/", "engine/bench.py")  # training recipes and benchmarks: not needed to serve


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(path: Path, module: str | None, level: int) -> str:
    """The absolute name of `from <level dots><module> import ...` written in `path`."""
    if level == 0:
        return module or ""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def dotted(node: ast.AST) -> str | None:
    """'engine.train.corpus' for the expression engine.train.corpus, else None."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(names)])
    return None


def imported_names(path: Path, attributes: bool = True) -> set[str]:
    """Every module `path` reaches by name: imports (absolute and relative, each `from` name
    also as a possible submodule), attribute chains on a name bound to a module, and
    importlib.import_module / __import__ with a literal name."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    bound: dict[str, str] = {}  # local name -> the module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.name)
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = resolve(path, node.module, node.level)
            names.add(base)
            for alias in node.names:
                names.add(f"{base}.{alias.name}")
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Call) and dotted(node.func) in ("importlib.import_module", "import_module",
                                                                  "__import__"):
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                names.add(node.args[0].value)
    for node in ast.walk(tree) if attributes else ():
        if isinstance(node, ast.Attribute) and (chain := dotted(node)):
            head, _, rest = chain.partition(".")
            if head in bound and rest:
                names.add(f"{bound[head]}.{rest}")
    return names


def reaches(names: set[str], package: str) -> set[str]:
    return {n for n in names if n == package or n.startswith(package + ".")}


def python_files(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def serving_files() -> list[Path]:
    files = python_files("engine") + python_files("gateway")
    return [p for p in files if not str(p.relative_to(ROOT)).startswith(OFFLINE)]


def test_engine_never_imports_gateway():
    offenders = {str(p.relative_to(ROOT)): sorted(reaches(imported_names(p), "gateway"))
                 for p in python_files("engine")}
    assert {p: n for p, n in offenders.items() if n} == {}


def is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def test_gateway_uses_only_the_engine_public_surface():
    """Import statements only (`engine.SpeechEngine` is the package's own export, not a module)."""
    offenders = {}
    for path in python_files("gateway"):
        modules = {n for n in reaches(imported_names(path, attributes=False), "engine") if is_module(n)}
        if modules - ENGINE_PUBLIC:
            offenders[str(path.relative_to(ROOT))] = sorted(modules - ENGINE_PUBLIC)
    assert offenders == {}


def test_serving_code_never_reaches_training_code():
    offenders = {str(p.relative_to(ROOT)): sorted(reaches(imported_names(p), "engine.train"))
                 for p in serving_files()}
    assert {p: n for p, n in offenders.items() if n} == {}


def test_the_layout_checks_see_every_way_of_writing_an_import(tmp_path, monkeypatch):
    """The detector itself: each spelling of 'reach engine.train' is caught."""
    spellings = {
        "from engine.train.corpus import build_corpus": True,
        "import engine.train.corpus": True,
        "from engine import train": True,
        "import engine\nx = engine.train.corpus": True,
        "import engine as e\ne.train.corpus.build_corpus()": True,
        "import importlib\nimportlib.import_module('engine.train.synth')": True,
        "from .train import textnorm": True,
        "from . import train": True,
        "import engine\nengine.Final": False,
        "from engine.textnorm import normalize": False,
        "from .textnorm import normalize": False,
    }
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "engine").mkdir()
    for i, (source, caught) in enumerate(spellings.items()):
        path = tmp_path / "engine" / f"m{i}.py"
        path.write_text(source + "\n")
        assert bool(reaches(imported_names(path), "engine.train")) is caught, source


def test_tests_never_import_bench():
    """What a test and a benchmark share lives in tests/kit/; a benchmark's own tests live in bench/."""
    files = [p for p in python_files("tests")]
    offenders = {str(p.relative_to(ROOT)): sorted(reaches(imported_names(p), "bench")) for p in files}
    assert {p: n for p, n in offenders.items() if n} == {}


def test_bench_takes_from_tests_only_the_kit():
    offenders = {}
    for path in python_files("bench"):
        outside_kit = {n for n in reaches(imported_names(path), "tests") if not reaches({n}, "tests.kit")
                       and n != "tests"}
        if outside_kit:
            offenders[str(path.relative_to(ROOT))] = sorted(outside_kit)
    assert offenders == {}


def test_the_dialog_core_is_plain_data():
    """Turn, PendingTurn and the history import only the standard library's data tools."""
    allowed = {"__future__", "dataclasses", "typing"}
    names = imported_names(ROOT / "gateway" / "dialog.py", attributes=False)
    assert {n.split(".")[0] for n in names} - allowed == set()


def test_responders_and_records_never_reach_redis():
    """A responder reads the dialog (gateway.dialog), not the stores; a record is encoded
    without knowing where it is kept."""
    files = python_files("gateway/responders") + [ROOT / "gateway" / "sessions" / "record.py"]
    offenders = {str(p.relative_to(ROOT)): sorted(reaches(imported_names(p), "redis")
                                                  | reaches(imported_names(p), "gateway.sessions")
                                                  - {"gateway.sessions.record"})
                 for p in files}
    assert {p: n for p, n in offenders.items() if n} == {}


def test_nothing_below_the_http_edge_imports_it():
    """gateway/app.py is HTTP only; what it serves (the call registry, metrics, SIP) never imports
    it back, so there is no cycle. cli.py runs the app; access.py's token endpoint borrows the
    app's body limits (a lazy import, inside the handler)."""
    above = {"gateway/app.py", "gateway/cli.py", "gateway/access.py"}
    offenders = {str(p.relative_to(ROOT)): sorted(reaches(imported_names(p, attributes=False), "gateway.app"))
                 for p in python_files("gateway") if str(p.relative_to(ROOT)) not in above}
    assert {p: n for p, n in offenders.items() if n} == {}


def test_the_conversation_rooms_never_reach_back_into_the_state_machine():
    """reply.py and barge_in.py are told what they need (reply.ReplyHost, callables); they
    never import gateway.conversation, so each can be read on its own."""
    rooms = [ROOT / "gateway" / name for name in ("reply.py", "barge_in.py", "speculation.py")]
    offenders = {str(p.relative_to(ROOT)): sorted(reaches(imported_names(p), "gateway.conversation"))
                 for p in rooms}
    assert {p: n for p, n in offenders.items() if n} == {}


def runtime_reads(path: Path) -> list[int]:
    """Lines of `path` that read an attribute named `runtime` (x.runtime, getattr(x, "runtime"))."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "runtime":
            lines.append(node.lineno)
        elif (isinstance(node, ast.Call) and dotted(node.func) in ("getattr", "hasattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and node.args[1].value == "runtime"):
            lines.append(node.lineno)
    return lines


def test_the_gateway_never_reaches_past_the_engine_contract():
    """The gateway uses an engine through engine.interface.Engine (admission, stats, device,
    streams) and never reads its `.runtime`, whatever the engine is."""
    offenders = {str(p.relative_to(ROOT)): runtime_reads(p) for p in python_files("gateway")}
    assert {p: lines for p, lines in offenders.items() if lines} == {}


def test_the_runtime_check_sees_both_spellings(tmp_path):
    for source, caught in {"engine.runtime.device": True, "getattr(host.engine, 'runtime')": True,
                           "self.engine.device": False, "engine.stats().ticks": False}.items():
        path = tmp_path / "m.py"
        path.write_text(source + "\n")
        assert bool(runtime_reads(path)) is caught, source
