"""WORKSHOP.md stays true: every `python SCRIPT ...` command in its code blocks parses (and, for train_rl.py,
passes check_config), every file it names exists, every `file.py:function` it names is defined there, every
`python -c` snippet runs, and the exercises' reference solutions (workshop/solutions/) match hand-computed values."""

import contextlib
import importlib.util
import io
import re
import sys
from pathlib import Path

import pytest
import torch

import checkpoint
import looped
import objectives
import test_docs
import train_rl as T

ROOT = Path(__file__).resolve().parents[1]
WORKSHOP = ROOT / "WORKSHOP.md"


def load_file(path):
    """Import a .py file of the repo by its path (workshop/solutions/psr.py is not a package)."""
    name = "ws_" + re.sub(r"\W", "_", str(path))
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


psr = load_file("workshop/solutions/psr.py")  # importing it registers nothing (register() does)


def shell_commands():
    """Every command line of WORKSHOP.md's code blocks, as argv lists (test_docs.shell_commands)."""
    return test_docs.shell_commands(WORKSHOP.read_text())


def python_commands(script=None):
    """(script, argv) of every `python SCRIPT ...` command (not `python -c`, `python -m`)."""
    return [(w[1], w[2:]) for w in shell_commands() if len(w) > 1 and w[0] == "python" and not w[1].startswith("-")
            and (script is None or w[1] == script)]


PARSERS = {**test_docs.PARSERS, "workshop/solutions/psr.py": test_docs.parse_train_rl}  # the parsers the pages use


def test_every_python_command_of_the_workshop_parses(monkeypatch):
    monkeypatch.setitem(objectives.OBJECTIVES, "psr", psr.PSR)  # what psr.py's register() does before it parses
    commands = python_commands()
    research_only = {"research/rounds/rounds.py", "research/rounds/climb.py", "tiny.py"}
    assert len(commands) >= 15 and {s for s, _ in commands} >= set(PARSERS) - research_only
    for script, argv in commands:
        assert (ROOT / script).is_file(), f"WORKSHOP.md runs {script}, which does not exist"
        if script not in PARSERS:  # research/*/*.py benchmarks: their own argparse; the file must exist
            continue
        try:
            PARSERS[script](argv)
        except (SystemExit, ValueError, AssertionError) as e:
            raise AssertionError(f"WORKSHOP.md: python {script} {' '.join(argv)}: {e!r}") from None


def test_every_exercise_has_the_parts_the_issue_asks_for():
    text = WORKSHOP.read_text()
    exercises = re.split(r"\n## Exercise \d+", text)[1:]
    assert 6 <= len(exercises) <= 8
    for i, ex in enumerate(exercises, 1):
        for part in ("**Goal.**", "**Run.**", "**Look at.**", "**Watch.**", "**Expect.**", "**Time.**",
                     "**Discuss.**"):
            assert part in ex, f"exercise {i} has no {part}"


def test_every_file_and_function_the_workshop_names_exists():
    text = WORKSHOP.read_text()
    refs = re.findall(r"`([\w./-]+\.py):([\w.]+)`", text)
    assert len(refs) >= 20
    modules = {}
    for path, name in refs:
        assert (ROOT / path).is_file(), f"`{path}:{name}`: no file {path}"
        if path not in modules:  # a top-level module is the one the tests import; others are loaded by path
            modules[path] = importlib.import_module(path[:-3]) if "/" not in path else load_file(path)
        module = modules[path]
        obj = module
        for part in name.split("."):
            assert hasattr(obj, part), f"`{path}:{name}`: {path} has no {name}"
            obj = getattr(obj, part)
    files = set(re.findall(r"`((?:[\w.-]+/)*[\w.-]+\.(?:py|md|jsonl|patch))`", text))
    files |= set(re.findall(r"`((?:[\w.-]+/)+)`", text))  # directories such as tiny_model/
    for path in files:
        if path.startswith(("runs/", "/")) or "/" not in path and not path.endswith(".py"):
            continue  # outputs of the exercises, and bare output names (metrics.jsonl, report.md)
        assert (ROOT / path).exists(), f"WORKSHOP.md names {path}, which does not exist"


def test_every_bare_name_the_workshop_quotes_is_in_the_code():
    """A quoted snake_case name (`problems_for_step`, `mixed_groups`, `tiny_ladder_val`) is a function, metric, data
    set or flag value that the repo's top-level scripts spell that way, so a rename shows up here."""
    source = "\n".join(p.read_text() for p in ROOT.glob("*.py"))
    names = set(re.findall(r"`([a-z][a-z0-9]*_[a-z0-9_]*)`", WORKSHOP.read_text()))
    assert names
    missing = sorted(n for n in names if not re.search(rf"\b{n}\b", source))
    assert not missing, f"WORKSHOP.md quotes names no script has: {missing}"


def test_every_python_c_snippet_runs(monkeypatch):
    """The `python -c "..."` hand checks run in this process (torch is imported already), from the repo root;
    those that read an exercise's run directory (runs/...) need the run, so only compile."""
    monkeypatch.chdir(ROOT)
    snippets = [w[2] for w in shell_commands() if w[:2] == ["python", "-c"]]
    for code in [c for c in snippets if "runs/" in c]:
        compile(code, "<WORKSHOP.md>", "exec")
    snippets = [c for c in snippets if "runs/" not in c]
    assert snippets
    for code in snippets:
        with contextlib.redirect_stdout(io.StringIO()) as out:
            exec(compile(code, "<WORKSHOP.md>", "exec"), {"__name__": "__workshop__"})
        assert out.getvalue().strip(), f"python -c {code!r} printed nothing"


# -----------------------------------------------------------------------------
# The numbers the exercises ask participants to compute by hand


def test_exercise3_group_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(objectives.group_advantages(r, scale_by_std=False), torch.tensor([[0.75, -0.25, -0.25, -0.25]]))
    # GRPO divides by the unbiased std, sqrt((0.75^2 + 3 * 0.25^2) / 3) = 0.5
    assert torch.allclose(objectives.group_advantages(r, scale_by_std=True), torch.tensor([[1.5, -0.5, -0.5, -0.5]]), atol=1e-5)


def test_exercise7_flops_of_the_looped_tiny_model_by_hand():
    import model as M
    c = M.Qwen3Config.from_json(ROOT / "tiny_model" / "config.json")
    deep = looped.add_loop(checkpoint.load_model("tiny", device="cpu"), "1:3:2")
    assert deep.config.layer_passes == c.num_hidden_layers + 2  # layers [1, 3) once more
    attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    layer = 2 * (attn + 3 * c.hidden_size * c.intermediate_size)
    assert M.flops_per_token(deep.config, 0) - M.flops_per_token(c, 0) == 2 * layer
    assert M.flops_per_token(c, 0, training=True) == 3 * M.flops_per_token(c, 0)


# -----------------------------------------------------------------------------
# Exercise 4's reference solution: PSR, A = 1 right / 0 wrong, token-level mean


def psr_loss_grad(correct, lengths, budget=4):
    cfg = T.Config(max_new_tokens=budget)
    c = torch.tensor([correct])
    adv = psr.PSR.advantages(torch.zeros(1, len(correct)), c, cfg).flatten()
    mask = torch.tensor([[1.0] * n + [0.0] * (budget - n) for n in lengths])
    logp = torch.full(mask.shape, -1.0, requires_grad=True)
    b = objectives.MicroBatch(logp=logp, old_logp=logp.detach(), ref_logp=None, mask=mask, adv=adv,
                              tis=torch.ones_like(mask), n_sequences=len(lengths), n_tokens=int(mask.sum()))
    loss = psr.PSR.loss(b, cfg)
    loss.backward()
    return loss.item(), logp.grad, adv


def test_psr_advantages_and_gradient_hand_computed():
    # correct [T, F, F, T], lengths [2, 3, 1, 4]: A = [1, 0, 0, 1]; 10 tokens in the batch, so at rho = 1
    # loss = -(1 * 2 + 1 * 4) / 10 = -0.6 and d loss / d logp_it = -A_i / 10 on completion tokens
    loss, grad, adv = psr_loss_grad([True, False, False, True], [2, 3, 1, 4])
    assert torch.equal(adv, torch.tensor([1.0, 0.0, 0.0, 1.0]))
    assert loss == pytest.approx(-0.6)
    expected = torch.tensor([[-0.1, -0.1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [-0.1, -0.1, -0.1, -0.1]])
    assert torch.allclose(grad, expected)
    _, grad, _ = psr_loss_grad([False] * 4, [2, 3, 1, 4])  # all wrong: nothing to learn from
    assert torch.count_nonzero(grad) == 0
    _, grad, _ = psr_loss_grad([True] * 4, [2, 3, 1, 4])  # all right: no baseline, so it still pushes
    assert torch.count_nonzero(grad) == 10


def test_psr_registers_only_when_asked(monkeypatch):
    assert "psr" not in objectives.OBJECTIVES  # importing the solution left the table alone
    monkeypatch.setitem(objectives.OBJECTIVES, "psr", objectives.OBJECTIVES.get("psr"))
    psr.register()
    assert objectives.OBJECTIVES["psr"] is psr.PSR
    cfg = T.parse_args(["--objective", "psr", "--model", "tiny"])
    T.check_config(cfg)
    assert cfg.objective == "psr" and cfg.steps == 60  # the tiny world's defaults still apply


def test_psr_solution_is_at_most_15_lines():
    src = (ROOT / "workshop" / "solutions" / "psr.py").read_text()
    body = src.split("def positive_only_advantages")[1].split("def register")[0]
    lines = [x for x in ("def positive_only_advantages" + body).splitlines() if x.strip()]
    assert len(lines) <= 15, lines


def test_the_workshop_imports_do_not_leak_into_other_tests():
    assert "psr" not in objectives.OBJECTIVES and sys.modules.get("train_rl") is T
