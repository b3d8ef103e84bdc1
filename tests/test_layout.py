"""The repo's layout keeps its promises: the core reads in one sitting, imports neither the tiny world nor a
research program, and research uses the core's public names (benchmarks/import_graph.py, by ast)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("import_graph", ROOT / "benchmarks" / "import_graph.py")
IG = importlib.util.module_from_spec(spec)
spec.loader.exec_module(IG)


def test_the_core_imports_no_tiny_world_and_no_research_and_research_uses_public_names():
    g = IG.graph()
    assert {"train_rl.py", "research/rounds/rounds.py", "research/report.py"} <= set(g)
    assert IG.broken_rules(g) == []
    assert "tiny" not in g["train_rl.py"][0] and "tiny" not in g["evaluate.py"][0]  # the MATH path, by name


def test_the_rules_catch_what_they_forbid():
    g = {"train_rl.py": (["model", "tiny"], []), "evaluate.py": (["research/bands/bands"], []),
         "research/x/y.py": (["train_rl"], [("train_rl", "_secret")]), "model.py": (["sample"], []),
         "sample.py": (["model"], []), "benchmarks/bench_verify.py": (["verify"], [("verify", "_number")])}
    assert IG.broken_rules(g) == [
        "train_rl.py imports tiny: the core and its options never import the tiny world or research",
        "evaluate.py imports research/bands/bands: the core and its options never import the tiny world or research",
        "research/x/y.py uses train_rl._secret: research uses the core's public names only",
        "model.py and sample.py import each other"]


def test_private_names_are_found_through_any_alias(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("import train_rl as T\nfrom verify import _number, grade\nT._hidden()\nT.public()\n")
    imports, private = IG.imports_of(path, {"train_rl", "verify"})
    assert imports == ["train_rl", "verify"] and sorted(private) == [("train_rl", "_hidden"), ("verify", "_number")]


def test_core_files_read_in_one_sitting():
    """No core or option file over ~600 lines: a longer one holds two concepts (verify.py's symbolic half is
    symbolic.py)."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in ROOT.glob("*.py")}
    assert set(sizes) >= {f"{m}.py" for m in IG.CORE + IG.OPTIONS}
    too_long = {name: n for name, n in sizes.items() if n > 630}
    assert not too_long, too_long
