"""The house rules a newcomer relies on (issue 73): tests/ and benchmarks/ do not import each other (what both need is
bertkit.testing), and no library function is longer than 60 lines."""
import ast
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


def test_tests_and_benchmarks_do_not_import_each_other():
    scripts = {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    for path in sorted((REPO / "tests").rglob("*.py")):
        names = imported_names(path)
        assert not names & scripts, f"{path} imports a benchmark script: {sorted(names & scripts)}"
        assert "path:benchmarks" not in names, f"{path} puts benchmarks/ on sys.path"
    for path in sorted((REPO / "benchmarks").rglob("*.py")):
        names = imported_names(path)
        assert "tests" not in names and "path:tests" not in names, f"{path} imports from tests/"


def test_every_benchmark_script_is_in_a_runner():
    """Each script is run by `make bench` (run_all.sh) or benchmarks/gpu_session.sh, or named in run_all.sh's list of
    the studies run by hand: none is left where nobody finds it."""
    runners = "".join((REPO / "benchmarks" / name).read_text() for name in ("run_all.sh", "gpu_session.sh"))
    loose = [p.name for p in sorted((REPO / "benchmarks").glob("*.py"))
             if p.stem not in runners.replace(".py", " ").replace("/", " ").split() and p.name not in runners]
    assert not loose, f"benchmark scripts in no runner: {loose}; add each to benchmarks/run_all.sh (or delete it)"


def test_no_library_function_is_longer_than_60_lines():
    long = set()
    for root in LIBRARY:
        for path in sorted((REPO / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        node.end_lineno - node.lineno + 1 > 60:
                    long.add(f"{path.relative_to(REPO)}:{node.name}")
    assert not long, f"functions over 60 lines: {sorted(long)}; split them"


# issue 84: a study imports the benchmark library (benchlib.py, record.py), never another study. These imports
# predate the rule and are to go (each study's shared parts moved into benchlib); none may be added.
STUDY_IMPORTS_TO_GO = {
    ("attention_tiles", "attention"), ("budget", "pretrain_transfer"), ("finetune_lockstep", "finetune_parity"),
    ("finetune_lockstep", "finetune_peer"), ("finetune_memory", "finetune_parity"),
    ("finetune_parity", "finetune_peer"), ("host_overhead", "attention"), ("korean_embeddings", "korean_transfer"),
    ("korean_transfer", "pretrain_transfer"),
    ("korean_vocab", "pretrain_transfer"), ("layer_norm", "attention"), ("modernbert_attention", "attention"),
    ("recipes", "pretrain_transfer"), ("triton_launch", "attention"),
}


def test_no_study_imports_another_study():
    scripts = {p.stem: p for p in (REPO / "benchmarks").glob("*.py")}
    library = {"benchlib", "record"}
    found = set()
    for name, path in scripts.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found |= {(name, m) for m in modules if m in scripts and m not in library}
    assert found - STUDY_IMPORTS_TO_GO == set(), "import benchlib (move the shared part there), not another study"
    assert STUDY_IMPORTS_TO_GO - found == set(), "an import went: take it off STUDY_IMPORTS_TO_GO"
