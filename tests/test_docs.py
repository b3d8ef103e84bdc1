"""The front door and the results pages stay true: every `python SCRIPT ...` command in a code block of README.md and
research/ parses with the script's own flags (train_rl.py's also pass check_config together), every results table
names the command that regenerates it, and the README stays a front door (~200 lines, linking every program)."""

import argparse
import re
import shlex
from pathlib import Path

import pytest

import cli
import evaluate as E
import tiny
import train_rl as T
from research import report as RP
from research.bands import bands as B
from research.rounds import climb as C
from research.rounds import rounds as R

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted(ROOT.glob("research/*.md")), *sorted(ROOT.glob("research/*/*.md"))]


def shell_commands(text):
    """Every command line of a Markdown text's code blocks: continuation lines joined, `for V in X ...; do A; B; done`
    loops (nested too) unrolled into A and B with each variable at its first value, comments dropped; as argv lists."""
    out = []
    for block in text.split("```")[1::2]:
        for line in block.replace("\\\n", " ").splitlines():
            line, parts = line.strip(), [line.strip()]
            if line.startswith("for ") or "; done" in line:  # a loop's body holds no quoted `;` or `#`
                line = line.split(" #")[0]
                while (loop := re.match(r"for (\w+) in (\S+)[^;]*;\s*do\s+", line)):
                    line = line[loop.end():].replace(f"${loop.group(1)}", loop.group(2))
                parts = [p.strip() for p in line.split(";") if p.strip() and p.strip() != "done"]
            for part in parts:
                part = part.strip().split(" && ")[-1]
                if part.startswith("python") or part.startswith("torchrun"):
                    words = shlex.split(part, comments=True)
                    if words and words[0] == "torchrun":  # torchrun [its flags] SCRIPT [flags]: keep the script's
                        words = ["torchrun"] + words[next(i for i, w in enumerate(words) if w.endswith(".py")):]
                    out.append([w.replace("$o", "drgrpo").replace("$s", "1").replace("$S", "1") for w in words])
    return out


def python_commands(path, launcher=False):
    """(script, argv) of every `python SCRIPT ...` or `torchrun ... SCRIPT ...` command of a page (not `python -c`,
    `python -m`); with launcher, (script, argv, 'python' or 'torchrun')."""
    return [(w[1], w[2:], w[0]) if launcher else (w[1], w[2:]) for w in shell_commands(path.read_text())
            if len(w) > 1 and not w[1].startswith("-")]


def parse_train_rl(argv):
    T.check_config(T.parse_args(argv))


def parse_evaluate(argv):
    if argv[:1] == ["compare"]:
        assert len([a for a in argv[1:] if not a.startswith("-")]) == 2, "compare takes two records files"
        return
    E.check_config(cli.parse_config(E.EvalConfig, argv, "", defaults=E.flag_defaults))


def parse_bands(argv):
    if argv[:1] in (["compare"], ["table"]):
        return
    B.check_config(cli.parse_config(B.BandsConfig, argv, "", defaults=B.flag_defaults))


def parse_rounds(argv):
    R.check_config(cli.parse_config(R.RoundsConfig, argv, "", defaults=R.flag_defaults))


def parse_climb(argv):
    C.check_config(cli.parse_config(C.ClimbConfig, argv, ""))


def parse_report(argv):
    parser = cli.add_flags(argparse.ArgumentParser(), RP.ReportConfig)
    parser.add_argument("runs", nargs="+")
    parser.parse_args(argv)


def parse_tiny(argv):
    tiny.check_config(cli.parse_config(tiny.TinyConfig, argv, ""))


PARSERS = {"train_rl.py": parse_train_rl, "evaluate.py": parse_evaluate, "research/bands/bands.py": parse_bands,
           "research/rounds/rounds.py": parse_rounds, "research/rounds/climb.py": parse_climb,
           "research/report.py": parse_report, "tiny.py": parse_tiny}


def flags_exist(script, argv):
    """A script with its own argparse (a benchmark): every --flag given must be spelled in its source, or be a
    train_rl.py flag it passes through."""
    source = (ROOT / script).read_text()
    passes_through = "train_rl" in source
    for word in argv:
        name = word.split("=")[0]
        if name.startswith("--no-") and f'"--{name[5:]}"' in source:  # argparse.BooleanOptionalAction's --no-X
            continue
        if name.startswith("--") and f'"{name}"' not in source:
            assert passes_through and name.lstrip("-").replace("-", "_") in T.Config.__dataclass_fields__, \
                f"{script} has no flag {name}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_command_of_the_page_parses(page, monkeypatch):
    monkeypatch.setattr(cli.torch.cuda, "is_available", lambda: True)  # the GPU recipes parse on a CPU machine too
    for script, argv, launcher in python_commands(page, launcher=True):
        if launcher == "torchrun":
            monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun sets: --fsdp is allowed under it
        else:
            monkeypatch.delenv("WORLD_SIZE", raising=False)
        assert (ROOT / script).is_file(), f"{page.name}: python {script}: no such file"
        try:
            PARSERS[script](argv) if script in PARSERS else flags_exist(script, argv)
        except (SystemExit, ValueError, AssertionError) as e:
            raise AssertionError(f"{page.relative_to(ROOT)}: python {script} {' '.join(argv)}: {e!r}") from None


def test_the_pages_show_commands_of_every_entry_point():
    scripts = {s for page in PAGES for s, _ in python_commands(page)}
    assert set(PARSERS) <= scripts | {"tiny.py"}
    assert {"research/rounds/rounds_table.py", "research/ladder/ladder.py", "research/sampler/bench_sample.py"} <= scripts


def tables(text):
    """(table lines, the text of its section before it, the text after it up to the next heading) per table."""
    lines, out, i = text.splitlines(), [], 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"\|[\s:|-]+\|$", lines[i + 1].strip()):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            start = max([k for k in range(i) if lines[k].startswith("#")] or [0])
            end = next((k for k in range(j, len(lines)) if lines[k].startswith("#")), len(lines))
            out.append((lines[i:j], "\n".join(lines[start:i]), "\n".join(lines[j:end])))
            i = j
        else:
            i += 1
    return out


RESULT_PAGES = sorted(ROOT.glob("research/*/README.md"))


@pytest.mark.parametrize("page", RESULT_PAGES, ids=[str(p.relative_to(ROOT)) for p in RESULT_PAGES])
def test_every_results_table_names_the_command_that_regenerates_it(page):
    found = tables(page.read_text())
    assert found, f"{page}: no table"
    for rows, before, after in found:
        cells = [c.strip().strip("*") for row in rows[2:] for c in row.strip("|").split("|")]
        if not any(re.fullmatch(r"[-+]?[\d.,]+(%|x|e[-+]?\d+)?( \[.*\]| \(.*\))?", c) for c in cells):
            continue  # a table of words (flags, files, methods), not of measurements
        assert re.search(r"python\s+\S+\.py", before + after), \
            f"{page.relative_to(ROOT)}: the table starting {rows[0][:60]!r} names no command"


def test_the_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 220
    assert "python train_rl.py --objective drgrpo --model tiny" in text and "python -m pytest -q tests" in text
    for page in RESULT_PAGES:
        assert str(page.relative_to(ROOT).parent) in text, f"README.md links no {page.parent.name} page"
