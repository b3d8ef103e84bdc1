"""
The repo's import graph, from the source alone (ast, nothing is imported), and the rules the layout keeps:

    python benchmarks/import_graph.py           # every file's imports of the repo's own modules, then the rules

1. The core (the design card's files) and the loop's options import neither the tiny world (tiny.py) nor any
   research program (research/): the MATH path needs neither.
2. Research programs (and the workshop's solutions) use the core's public names only: no `module._name`, no
   `from module import _name`. (A core file's own benchmark may time its internals: benchmarks/bench_verify.py
   counts symbolic's sympy calls.)
3. Imports run one way between the core's layers: no core file imports a file that imports it back.
4. No research program (research/<program>/) imports another: what two share moves into the core as a public
   function (e.g. runs.write_jsonl), into one of them, or, when the core has no use for it, into a module directly
   under research/ that imports no program (research/hint.py, STaR's hint). research/report.py, the report over
   every program's outputs, may read them.
tests/test_layout.py runs the same checks.
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ("model", "model_kernels", "checkpoint", "sample", "batching", "symbolic", "verify", "reward", "problems",
        "objectives", "update", "train_rl", "evaluate")  # + tiny.py
OPTIONS = ("curriculum", "looped", "model_options", "lora", "distributed", "runs", "stats", "diversity", "cli", "memory",
           "guards", "coupled")
TINY = "tiny"


def own_modules():
    """{name: path} of the top-level modules (core, options, tiny)."""
    return {p.stem: p for p in ROOT.glob("*.py")}


def imports_of(path, names):
    """The repo modules a file imports (top-level names, and research.* as 'research/...'), and the underscored
    names it reaches for: [(module, name)]."""
    tree = ast.parse(path.read_text(), str(path))
    found, aliases, private = set(), {}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                top = a.name.split(".")[0]
                if top in names:
                    found.add(top)
                    aliases[a.asname or top] = top
                elif top == "research":
                    found.add(a.name.replace(".", "/"))
        elif isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top in names:
                found.add(top)
                private += [(top, a.name) for a in node.names if a.name.startswith("_")]
            elif top == "research":
                found.add("/".join([node.module.replace(".", "/"), *(a.name for a in node.names)]))
    for node in ast.walk(tree):  # module._name, through any alias of a repo module
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            private.append((aliases[node.value.id], node.attr))
    return sorted(found), private


def graph():
    """{file relative to the repo: (repo modules it imports, private names it uses)} for every .py file but tests."""
    names = set(own_modules())
    files = [*ROOT.glob("*.py"), *ROOT.glob("research/**/*.py"), *ROOT.glob("benchmarks/*.py"),
             *ROOT.glob("workshop/**/*.py")]
    return {str(p.relative_to(ROOT)): imports_of(p, names) for p in sorted(files)}


def broken_rules(g):
    """The rule violations of a graph, as lines (empty when the layout holds)."""
    out = []
    shared = {p[:-3] for p, (i, _) in g.items()  # research/<module>.py that imports no program: any program's
              if p.startswith("research/") and p.count("/") == 1 and not any(m.startswith("research/") for m in i)}
    for path, (imports, private) in g.items():
        module = path[:-3]
        if module in CORE + OPTIONS:
            out += [f"{path} imports {m}: the core and its options never import the tiny world or research"
                    for m in imports if m == TINY or m.startswith("research/")]
        if path.startswith(("research/", "workshop/")):
            out += [f"{path} uses {m}.{n}: research uses the core's public names only" for m, n in private]
        if path.count("/") >= 2 and path.startswith("research/"):  # a file of a program: research/<program>/...
            program = path.split("/")[1]
            out += [f"{path} imports {m}: a research program never imports another" for m in imports
                    if m.startswith("research/") and m.split("/")[1] != program
                    and "/".join(m.split("/")[:2]) not in shared]
    core = {p[:-3]: set(i) for p, (i, _) in g.items() if p[:-3] in CORE + OPTIONS + (TINY,)}
    for a, deps in core.items():
        out += [f"{a}.py and {b}.py import each other" for b in deps if b in core and a in core[b] and a < b]
    return out


def main():
    g = graph()
    for path, (imports, _) in g.items():
        layer = ("core" if path[:-3] in CORE or path == "tiny.py" else "option" if path[:-3] in OPTIONS else
                 path.split("/")[0])
        print(f"{path:<45} {layer:<10} {', '.join(imports) or '-'}")
    problems = broken_rules(g)
    print("\n".join(problems) if problems else "\nrules hold: the core and its options import no tiny world and no "
          "research; research uses public names; no research program imports another; no import cycles between "
          "top-level modules")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
