"""
STaR's rationalization hint (Zelikman et al. 2022, sec. 3.2): a problem with its answer stated after it, so the model
writes a solution that reaches it. For deliberation on TRAINING problems only, through evaluate.evaluate's `hint`
seam: research/rounds (--rationalize) and research/ladder (reach --hint). An evaluation never sees one, and the
traces it yields are trained on without it.

Two programs use it and no program imports another, so it lives here, directly under research/ (a module that
imports no program, benchmarks/import_graph.py), not in the core, which has no use for it.
"""

# The same line for every prompt template, in words the tiny world's characters spell.
HINT = "\n\nfinal answer: {answer}"


def hinted(problem):
    """The problem dict with its answer stated after the problem text."""
    return dict(problem, problem=problem["problem"].strip() + HINT.format(answer=str(problem["answer"]).strip()))
