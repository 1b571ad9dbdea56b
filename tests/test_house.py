"""The house rules a newcomer relies on (issue 73): tests/ and benchmarks/ do not import each other (what both need is
bertkit.testing), and no library function is longer than 60 lines."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("bertkit", "pipelines", "kernels")


def imported_names(path: Path) -> set[str]:
    """The top-level module names a file imports, and the folders it puts on sys.path by name."""
    tree, names = ast.parse(path.read_text(encoding="utf-8")), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("insert", "append",
                                                                                  "syspath_prepend"):
            names |= {f"path:{c.value}" for c in ast.walk(node) if isinstance(c, ast.Constant)
                      and isinstance(c.value, str)}
    return names


BENCH = REPO / "benchmarks"
KINDS = ("gates", "studies", "lib")   # quick measurements run by `make bench`; long ones run by hand; what both import


def scripts(kind: str) -> dict[str, Path]:
    return {p.stem: p for p in sorted((BENCH / kind).glob("*.py")) if p.name != "_lib_path.py"}


def test_tests_and_benchmarks_do_not_import_each_other():
    names_of_scripts = {name for kind in KINDS for name in scripts(kind)}
    for path in sorted((REPO / "tests").rglob("*.py")):
        names = imported_names(path)
        assert not names & names_of_scripts, f"{path} imports a benchmark script: {sorted(names & names_of_scripts)}"
        assert not any(n.startswith("path:benchmarks") for n in names), f"{path} puts benchmarks/ on sys.path"
    for path in sorted(BENCH.rglob("*.py")):
        names = imported_names(path)
        assert "tests" not in names and "path:tests" not in names, f"{path} imports from tests/"


def test_the_layout_shows_gates_and_studies():
    """issue 84: a script is a gate (benchmarks/gates/, run by `make bench` through run_all.sh, which runs the
    whole folder, and on a GPU by gpu_session.sh), a study (benchmarks/studies/, run by hand, its findings in a
    dated document in docs/studies/ or benchmarks/results/) or the library they import (benchmarks/lib/)."""
    loose = sorted(p.name for p in BENCH.glob("*.py"))
    assert not loose, f"{loose} at benchmarks/'s top: move each to gates/, studies/ or lib/"
    assert 'for gate in benchmarks/gates/[a-z]*.py' in (BENCH / "run_all.sh").read_text()
    gpu = (BENCH / "gpu_session.sh").read_text()
    for name in re.findall(r"benchmarks/(\w+)/(\w+)\.py", gpu):
        assert name[0] == "gates", f"gpu_session.sh runs benchmarks/{name[0]}/{name[1]}.py: only gates run there"
    documents = "".join(p.read_text(encoding="utf-8") for p in [*(REPO / "docs" / "studies").glob("*.md"),
                                                                   *(BENCH / "results").glob("*.md")])
    undocumented = [name for name in scripts("studies") if f"benchmarks/studies/{name}.py" not in documents]
    assert not undocumented, f"studies named in no document of docs/studies/: {undocumented}"
    library = scripts("lib")
    used = {n for kind in KINDS for p in scripts(kind).values() for n in imported_names(p)} | {
        n for kind in KINDS for p in scripts(kind).values() for n in re.findall(r'"(\w+)\.py"', p.read_text())}
    assert set(library) <= used, f"library modules nothing imports: {sorted(set(library) - used)}"


def test_no_library_function_is_longer_than_60_lines():
    long = set()
    for root in LIBRARY:
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        node.end_lineno - node.lineno + 1 > 60:
                    long.add(f"{path.relative_to(REPO)}:{node.name}")
    assert not long, f"functions over 60 lines: {sorted(long)}; split them"


def test_no_benchmark_imports_another():
    """issue 84: a gate or a study imports the benchmark library (benchmarks/lib) and bertkit, never another gate
    or study, so a reader opens one file and a change to one moves no other's numbers."""
    others = {name for kind in ("gates", "studies") for name in scripts(kind)}
    found = {(kind, name, m) for kind in KINDS for name, path in scripts(kind).items()
             for m in imported_names(path) & others}
    assert not found, f"(folder, script, imported): {sorted(found)}; move the shared part into benchmarks/lib/"
