"""bands.py: band assignment, the P(mixed) formula against hand values, the contingency table, the held-out
split and its exclusion from every training pool, the MATH-500 guard, resume, and bad inputs. Scripted
completions give known correct counts; the committed tiny checkpoint (0.8M parameters) runs the real path."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from research.bands import bands as B
import model as M
import problems as P
import runs
import sample
from sample import Completion
import checkpoint

# (id, source, problem, answer, correct of 4): source s1 has every band, every s2 problem is mixed
SCRIPT = [("a0", "s1", "11 + 22", "33", 0), ("a1", "s1", "40 - 15", "25", 2), ("a2", "s1", "3 * 7", "21", 4),
          ("a3", "s1", "50 + 6", "56", 1), ("b0", "s2", "81 - 9", "72", 3), ("b1", "s2", "12 * 4", "48", 1),
          ("b2", "s2", "66 + 7", "73", 2), ("b3", "s2", "95 - 41", "54", 2)]
MIXED = {"a1", "a3", "b0", "b1", "b2", "b3"}


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture
def scripted(tmp_path, monkeypatch):
    """A pool file and a stand-in for sample.generate whose sample j is right iff j < the script's count;
    returns (pool path, list of prompt counts per generate call)."""
    tokenizer, calls = checkpoint.load_tokenizer("tiny"), []

    def generate(model, prompts, max_new_tokens, n=1, **kw):
        calls.append(len(prompts))
        out = []
        for i, p in enumerate(prompts):
            text = tokenizer.decode(p)
            _, _, _, answer, right = next(row for row in SCRIPT if f"Problem:\n{row[2]}\n" in text)
            for j in range(n):
                ids = tokenizer.encode(f"\\boxed{{{answer if j < right else int(answer) + 1}}}")
                out.append(Completion(prompt_index=i, tokens=ids + [tokenizer.eos_id], finish_reason="stop"))
        return out
    monkeypatch.setattr(sample, "generate", generate)
    rows = [dict(id=i, source=s, problem=q, answer=a) for i, s, q, a, _ in SCRIPT]
    return write_jsonl(tmp_path / "pool.jsonl", rows), calls


def run_cli(dataset, out, *extra):
    return B.main(["--model", "tiny", "--dataset", str(dataset), "-k", "4", "--max-new-tokens", "16", "--out",
                   str(out), "--batch-size", "3", "--group-by", "source", *extra])


# -----------------------------------------------------------------------------
# Formulas against hand values


def test_band_assignment():
    assert B.band(0, 8) == "all_zero" and B.band(8, 8) == "all_one"
    assert {B.band(c, 8) for c in range(1, 8)} == {"mixed"}
    assert B.band(0, 1) == "all_zero" and B.band(1, 1) == "all_one"
    for bad in (-1, 9):
        with pytest.raises(ValueError, match=f"n_correct={bad} must be in"):
            B.band(bad, 8)


def test_p_mixed_hand_values():
    # G = 8: 1 - 2/256 at p = 0.5; 1 - 0.9^8 - 0.1^8 = 1 - 0.43047 - 1e-8; 1 - 0.95^8 - 0.05^8 = 1 - 0.66342
    assert B.p_mixed(0.5, 8) == pytest.approx(0.9922, abs=1e-4) == 1 - 2 / 256
    assert B.p_mixed(0.9, 8) == pytest.approx(0.5695, abs=1e-4)
    assert B.p_mixed(0.05, 8) == pytest.approx(0.3366, abs=1e-4)
    assert B.p_mixed(0.3, 2) == pytest.approx(2 * 0.3 * 0.7)  # G = 2: exactly one right, either order
    assert B.p_mixed(0.0, 8) == B.p_mixed(1.0, 8) == 0.0 and B.p_mixed(0.4, 1) == 0.0
    assert B.p_mixed(0.2, 8) == pytest.approx(B.p_mixed(0.8, 8))
    assert B.binomial_histogram(10, 0.5, 2) == pytest.approx([2.5, 5.0, 2.5])
    h = B.binomial_histogram(40, 0.3, 8)
    assert sum(h) == pytest.approx(40) and 40 - h[0] - h[8] == pytest.approx(40 * B.p_mixed(0.3, 8))


def test_table_prints_the_issue_numbers(capsys):
    assert B.main(["table", "-k", "8"]) == 8
    out = capsys.readouterr().out
    assert "G = 8" in out and all(v in out for v in ("99.2%", "57.0%", "33.7%"))
    with pytest.raises(ValueError, match="-k must be at least 1"):
        B.main(["table", "-k", "0"])


# -----------------------------------------------------------------------------
# Contingency table


def rows_of(bands_by_id, answer="1"):
    return [dict(id=i, band=b, answer=answer) for i, b in bands_by_id.items()]


def test_contingency_hand_table(tmp_path, capsys):
    a = rows_of(dict(x1="all_zero", x2="mixed", x3="mixed", x4="all_one", x5="all_zero"))
    b = rows_of(dict(x1="mixed", x2="mixed", x3="all_one", x4="all_one", x9="all_zero"))
    c = B.contingency(a, b)
    assert (c["n"], c["only_a"], c["only_b"]) == (4, 1, 1)
    expected = {("all_zero", "mixed"): 1, ("mixed", "mixed"): 1, ("mixed", "all_one"): 1, ("all_one", "all_one"): 1}
    assert {(x, y): c["table"][x][y] for x in B.BANDS for y in B.BANDS} == \
        {(x, y): expected.get((x, y), 0) for x in B.BANDS for y in B.BANDS}
    # through the CLI, from files
    fa, fb = write_jsonl(tmp_path / "a.jsonl", a), write_jsonl(tmp_path / "b.jsonl", b)
    assert B.main(["compare", str(fa), str(fb)])["table"] == c["table"]
    out = capsys.readouterr().out.splitlines()
    assert out[2].split() == ["all_zero", "0", "1", "0", "1"] and out[5].split() == ["total", "0", "2", "2", "4"]
    assert c["changes"] == 2 and c["noise"] is None  # rows without n_correct and k: no noise expectation
    assert out[-1].startswith("band changes: 2 of 4; no noise expectation: the rows need 'n_correct' and 'k'")


def test_contingency_errors(tmp_path):
    with pytest.raises(ValueError, match="share no problem id"):
        B.contingency(rows_of(dict(x1="mixed")), rows_of(dict(y1="mixed")))
    with pytest.raises(ValueError, match="'x1' has answer '1' in A but '2' in B"):
        B.contingency(rows_of(dict(x1="mixed")), rows_of(dict(x1="mixed"), answer="2"))
    with pytest.raises(FileNotFoundError, match="no such bands file"):
        B.read_bands(tmp_path / "nothing.jsonl")
    bad = write_jsonl(tmp_path / "bad.jsonl", [dict(id="x1", band="mixed"), dict(id="x2", band="some")])
    with pytest.raises(ValueError, match="bad.jsonl:2: not a bands row"):
        B.read_bands(bad)
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [dict(id="x1", band="mixed", k=8, n_correct=8)])
    with pytest.raises(ValueError, match="wrong.jsonl:1: band 'mixed' does not follow from n_correct=8 of k=8"):
        B.read_bands(wrong)
    r = subprocess.run([sys.executable, "bands.py", "compare", str(tmp_path / "a"), str(bad)], capture_output=True,
                       text=True, cwd=Path(B.__file__).parent)
    assert r.returncode != 0 and "bands.py: error:" in r.stderr and "Traceback" not in r.stderr


# -----------------------------------------------------------------------------
# Band changes expected from sampling noise alone


def test_band_change_probability_hand_values():
    # k = 2 at p = 0.5: 0, 1, 2 right with 1/4, 1/2, 1/4, i.e. all_zero, mixed, all_one by the band rule; two
    # independent runs agree with 1/16 + 1/4 + 1/16 = 3/8, so they differ with 5/8
    assert B.band_probabilities(0.5, 2) == dict(all_zero=0.25, mixed=0.5, all_one=0.25)
    assert B.p_band_change(0.5, 2, 2) == pytest.approx(5 / 8)
    assert B.p_band_change(0.3, 1, 1) == pytest.approx(2 * 0.3 * 0.7)  # k = 1: no mixed band, right in one run only
    # k = 8 against k = 16 at p = 0.5: the ends have 1/2^8 and 1/2^16, the rest is mixed
    agree = 2 / 2**8 / 2**16 + (1 - 2 / 2**8) * (1 - 2 / 2**16)
    assert B.p_band_change(0.5, 8, 16) == pytest.approx(1 - agree)
    for k_a, k_b in ((2, 2), (8, 16), (1, 5)):  # a problem never or always solved never changes band
        assert B.p_band_change(0.0, k_a, k_b) == B.p_band_change(1.0, k_a, k_b) == 0.0
    assert B.poisson_binomial([0.5, 0.5]) == pytest.approx([0.25, 0.5, 0.25])
    qs = [0.1, 0.6, 0.3]  # against every outcome of three coins
    brute = [0.0] * 4
    for bits in range(8):
        x = [(bits >> i) & 1 for i in range(3)]
        brute[sum(x)] += math.prod(q if b else 1 - q for q, b in zip(qs, x))
    assert B.poisson_binomial(qs) == pytest.approx(brute)


def counted_rows(counts, k):
    return [dict(id=i, answer="1", k=k, n_correct=c, band=B.band(c, k)) for i, c in counts.items()]


def test_noise_expectation_hand_case():
    # two problems at 1 of 2 in both runs (pooled p = 1/2, q = 5/8 each) and one at 0 of 2 (p = 0, q = 0)
    a = counted_rows(dict(x1=1, x2=1, x3=0), 2)
    e = B.contingency(a, a)["noise"]
    assert e["expected_changes"] == pytest.approx(5 / 4) and e["sd"] == pytest.approx(math.sqrt(2 * 5 / 8 * 3 / 8))
    # the count of changes: 0, 1, 2 with (3/8)^2, 2 (5/8)(3/8), (5/8)^2 = 9/64, 30/64, 25/64
    assert e["range95"] == [0, 2] and e["p_at_least_observed"] == 1.0  # observed: no change
    assert e["table"]["mixed"]["mixed"] == pytest.approx(2 * 1 / 4) and e["table"]["all_zero"]["all_zero"] == \
        pytest.approx(1 + 2 / 16)  # x3 always; x1, x2 with 1/4 * 1/4 each
    assert sum(v for row in e["table"].values() for v in row.values()) == pytest.approx(3)
    none = B.contingency(counted_rows(dict(x1=0, x2=2), 2), counted_rows(dict(x1=0, x2=4), 4))["noise"]
    assert none["expected_changes"] == 0.0 and none["range95"] == [0, 0]  # p = 0 and p = 1: nothing can change


def test_compare_k8_against_k16_files(tmp_path, capsys):
    c8 = dict(x0=0, x1=1, x2=4, x3=8, x4=7, x5=0, x6=3, x7=8)
    c16 = dict(x0=0, x1=0, x2=9, x3=16, x4=16, x5=2, x6=5, x7=16)
    for name, counts, k in (("k8", c8, 8), ("k16", c16, 16)):
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "bands.jsonl", counted_rows(counts, k))
    c = B.main(["compare", str(tmp_path / "k8"), str(tmp_path / "k16")])
    # observed: x1 mixed -> all_zero, x4 mixed -> all_one, x5 all_zero -> mixed
    assert c["changes"] == 3 and (c["k_a"], c["k_b"]) == ([8], [16]) and not c["shared_draws"]
    by_hand = sum(B.p_band_change((c8[i] + c16[i]) / 24, 8, 16) for i in c8)  # pooled p over 24 samples
    assert c["noise"]["expected_changes"] == pytest.approx(by_hand)
    assert B.p_band_change(0 / 24, 8, 16) == B.p_band_change(24 / 24, 8, 16) == 0.0  # x0 and x3 cannot change
    out = capsys.readouterr().out
    assert f"band changes: 3 of 8 observed (k=8 in {tmp_path / 'k8'}, k=16 in {tmp_path / 'k16'}); from sampling " \
           f"noise alone {by_hand:.1f} +- 2 sd" in out and "warning" not in out
    # runs of one model with one seed share their draws: said, because the noise model assumes independence
    for name in ("k8", "k16"):
        (tmp_path / name / "settings.json").write_text(json.dumps(dict(model="m", seed=0, temperature=1.0)))
    assert B.main(["compare", str(tmp_path / "k8"), str(tmp_path / "k16" / "bands.jsonl")])["shared_draws"]
    assert "warning: both runs have the same model, seed" in capsys.readouterr().out
    (tmp_path / "k16" / "settings.json").write_text(json.dumps(dict(model="m", seed=1, temperature=1.0)))
    assert not B.main(["compare", str(tmp_path / "k8"), str(tmp_path / "k16")])["shared_draws"]


# -----------------------------------------------------------------------------
# Held-out split


def test_heldout_split_deterministic_per_group():
    pool = [dict(id=f"a{i}", source="a") for i in range(10)] + [dict(id=f"b{i}", source="b") for i in range(6)] + \
        [dict(id=f"n{i}") for i in range(3)]  # no source: the group "?"
    held, rest = B.heldout_split(pool, 2, "source", seed=0)
    assert sorted(B.group_value(p, "source") for p in held) == ["?", "?", "a", "a", "b", "b"]
    assert {p["id"] for p in held} | {p["id"] for p in rest} == {p["id"] for p in pool} and len(rest) == 13
    assert [p["id"] for p in rest] == [p["id"] for p in pool if p not in held]  # pool order kept
    assert B.heldout_split(pool, 2, "source", seed=0)[0] == held
    assert {p["id"] for p in B.heldout_split(pool[::-1], 2, "source", seed=0)[0]} == {p["id"] for p in held}
    only_a = B.heldout_split(pool[:10], 2, "source", seed=0)[0]  # a group's choice ignores the other groups
    assert only_a == [p for p in held if p.get("source") == "a"]
    assert any(B.heldout_split(pool, 2, "source", seed=s)[0] != held for s in range(1, 5))
    assert B.heldout_split(pool, 0)[0] == []
    with pytest.raises(ValueError, match=r"--heldout-per-group 4: group source=\? has only 3 problems"):
        B.heldout_split(pool, 4)
    with pytest.raises(ValueError, match="--heldout-per-group must be >= 0"):
        B.heldout_split(pool, -1)


def test_cli_bands_pools_and_heldout_exclusion(scripted, tmp_path, capsys):
    pool, calls = scripted
    out = tmp_path / "run"
    summary = run_cli(pool, out, "--heldout-per-group", "2")
    rows = read_lines(out / "bands.jsonl")
    assert [(r["id"], r["n_correct"], r["k"]) for r in rows] == [(i, c, 4) for i, _, _, _, c in SCRIPT]
    assert {r["id"] for r in rows if r["band"] == "mixed"} == MIXED
    tokenizer = checkpoint.load_tokenizer("tiny")  # every sample is \boxed{answer} or \boxed{answer + 1}, then the stop token
    for r, (_, _, _, answer, right) in zip(rows, SCRIPT):
        assert r["distinct_answers"] == (1 if right in (0, 4) else 2) and r["finish_reasons"] == dict(stop=4)
        if right in (0, 4):  # four identical completions: nothing between them
            assert r["dispersion"] == pytest.approx(0.0, abs=1e-6)
        else:
            assert r["dispersion"] > 1e-4
        assert r["completion_tokens_mean"] == len(tokenizer.encode(f"\\boxed{{{answer}}}")) + 1
        assert r["completion_tokens_std"] == 0.0
    # hand counts: correct 15 of 32; histogram of 0..4 correct: a0 | a3 b1 | a1 b2 b3 | b0 | a2
    mean = lambda rs: pytest.approx(sum(r["dispersion"] for r in rs) / len(rs))  # noqa: E731
    assert summary["overall"] == dict(n=8, all_zero=1, mixed=6, all_one=1, accuracy=15 / 32,
                                      mixed_if_equally_hard=pytest.approx(8 * (1 - (15 / 32)**4 - (17 / 32)**4)),
                                      dispersion_mean=mean(rows))
    assert summary["dispersion_by_band"] == dict(all_zero=pytest.approx(0.0, abs=1e-6), all_one=pytest.approx(
        0.0, abs=1e-6), mixed=mean([r for r in rows if r["band"] == "mixed"]))
    assert summary["overall"]["mixed_if_equally_hard"] == pytest.approx(6.9765, abs=1e-4)
    assert summary["histogram"] == [1, 2, 3, 1, 1]
    assert summary["per_group"]["s1"] == dict(n=4, all_zero=1, mixed=2, all_one=1, accuracy=7 / 16,
                                              mixed_if_equally_hard=pytest.approx(4 * B.p_mixed(7 / 16, 4)),
                                              dispersion_mean=mean(rows[:4]))
    assert (summary["per_group"]["s2"]["mixed"], summary["per_group"]["s2"]["accuracy"]) == (4, 0.5)
    assert json.loads((out / "bands_summary.json").read_text()) == json.loads(json.dumps(summary))
    # the held-out set: 2 per source, and in no training pool, although both s2 ones are mixed
    held = {p["id"] for p in read_lines(out / "heldout.jsonl")}
    assert sorted(i[0] for i in held) == ["a", "a", "b", "b"]
    mixed_pool = [p["id"] for p in P.load_problems(str(out / "mixed_pool.jsonl"))]  # what train_rl.py reads
    full_pool = [p["id"] for p in P.load_problems(str(out / "full_pool.jsonl"))]
    assert mixed_pool == [i for i, *_ in SCRIPT if i in MIXED - held]
    assert full_pool == [i for i, *_ in SCRIPT if i not in held]
    assert summary["pools"] == dict(heldout=4, mixed_pool=len(mixed_pool), full_pool=4)
    printed = capsys.readouterr().out
    assert "source=s2" in printed and "P(mixed)" in printed and "mixed_pool.jsonl" in printed
    assert "dispersion (mean pairwise cosine distance" in printed
    # rerun: resumed from records.jsonl, nothing sampled again, the same files
    calls.clear()
    assert run_cli(pool, out, "--heldout-per-group", "2")["overall"] == summary["overall"]
    assert calls == [] and read_lines(out / "bands.jsonl") == rows
    with pytest.raises(ValueError, match="temperature: 1.0 there, 0.5 now"):
        run_cli(pool, out, "--heldout-per-group", "2", "--temperature", "0.5")


def test_math500_never_enters_a_pool(tmp_path):
    leak = dict(P.load_problems("math500", limit=1)[0], id="leak")
    pool = write_jsonl(tmp_path / "pool.jsonl", [dict(id="ok", source="s", problem="1 + 1", answer="2"), leak])
    for dataset in (pool, "math500"):
        with pytest.raises(ValueError, match=f"--dataset {dataset}: .* held-out set math500 .*MATH-500"):
            run_cli(dataset, tmp_path / "run", "--heldout-per-group", "0")
    assert not (tmp_path / "run").exists()  # refused before sampling
    with pytest.raises(ValueError, match="held-out set math500"):
        B.write_pools(tmp_path, [], dict(mixed_pool=[leak]))
    assert list(tmp_path.glob("*_pool.jsonl")) == [] and not (tmp_path / "heldout.jsonl").exists()


@pytest.mark.parametrize("extra, message", [
    (["-k", "1"], "-k must be at least 2"),
    (["--temperature", "0"], "--temperature must be > 0"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
    (["--limit", "0"], "--limit must be at least 1"),
    (["--dataset", "tiny_val"], "--dataset tiny_val is given twice"),
    (["--heldout-per-group", "30"], "--heldout-per-group 30: group level=2 has only"),
])
def test_bad_arguments_are_named(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        B.main(["--model", "tiny", "--dataset", "tiny_val", "--limit", "20", "--group-by", "level",
                "--out", str(tmp_path / "run"), *extra])
    with pytest.raises(FileNotFoundError, match="nope.jsonl: no such dataset file"):
        run_cli(tmp_path / "nope.jsonl", tmp_path / "run")


# -----------------------------------------------------------------------------
# The real path: the committed tiny checkpoint samples


def test_tiny_checkpoint_bands_agree_with_records(tmp_path, capsys):
    args = ["--model", "tiny", "--dataset", "tiny_val", "--limit", "6", "-k", "3", "--max-new-tokens", "48",
            "--group-by", "level", "--heldout-per-group", "1"]
    summary = B.main(args + ["--out", str(tmp_path / "a")])
    records, rows = read_lines(tmp_path / "a" / "records.jsonl"), read_lines(tmp_path / "a" / "bands.jsonl")
    assert [r["id"] for r in records] == [r["id"] for r in rows] and len(rows) == 6
    for rec, row in zip(records, rows):
        assert len(rec["samples"]) == row["k"] == 3 and row["group"] == str(rec["level"])
        assert row["n_correct"] == sum(s["correct"] for s in rec["samples"]) == rec["n_correct"]
        assert row["band"] == B.band(row["n_correct"], 3)
        assert sum(row["finish_reasons"].values()) == 3 and 1 <= row["distinct_answers"] <= 3
        assert row["dispersion"] == rec["dispersion"] and 0.0 <= row["dispersion"] <= 2.0
    assert sum(summary["histogram"]) == 6
    assert sum(summary["overall"][b] for b in B.BANDS) == 6
    assert sum(g["n"] for g in summary["per_group"].values()) == 6
    held = {p["id"] for p in read_lines(tmp_path / "a" / "heldout.jsonl")}
    assert len(held) == len(summary["per_group"])  # one per level
    assert held.isdisjoint(p["id"] for p in read_lines(tmp_path / "a" / "mixed_pool.jsonl"))
    # another sampling seed: the same held-out set; the table of the two runs counts every problem once
    B.main(args + ["--seed", "1", "--out", str(tmp_path / "b")])
    assert (tmp_path / "b" / "heldout.jsonl").read_text() == (tmp_path / "a" / "heldout.jsonl").read_text()
    c = B.main(["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert c["n"] == 6 and sum(sum(row.values()) for row in c["table"].values()) == 6
    assert not c["shared_draws"] and 0 <= c["noise"]["expected_changes"] <= 6  # seeds 0 and 1: independent draws
    same = B.main(["compare", str(tmp_path / "a"), str(tmp_path / "a" / "bands.jsonl")])  # diagonal
    assert all(same["table"][x][y] == (summary["overall"][x] if x == y else 0) for x in B.BANDS for y in B.BANDS)
    assert same["changes"] == 0 and same["shared_draws"]  # one run against itself: the same draws


def test_help_prints_and_exits_0_and_missing_flags_are_one_line():
    here = Path(B.__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "research/bands/bands.py", "--help"], capture_output=True, text=True, cwd=here)
    assert r.returncode == 0 and "--dataset" in r.stdout and "--threads" in r.stdout, r.stderr
    r = subprocess.run([sys.executable, "research/bands/bands.py", "--model", "tiny"], capture_output=True, text=True,
                       cwd=here)
    assert (r.returncode, r.stderr) == (2, "bands.py: error: the following arguments are required: --dataset, --out\n")


def test_a_too_long_or_unencodable_problem_is_named_before_out_is_claimed(tmp_path):
    long = write_jsonl(tmp_path / "long.jsonl", [dict(id="ok", problem="1 + 2", answer="3"),
                                                 dict(id="big", problem="1 + " * 300 + "2", answer="0")])
    with pytest.raises(ValueError) as e:
        run_cli(long, tmp_path / "out", "--heldout-per-group", "0")
    assert str(e.value).startswith(f"{long}: problem 'big' has a ") and "context" in str(e.value)
    accent = write_jsonl(tmp_path / "accent.jsonl", [dict(id="q1", problem="1 + \u00e9", answer="3")])
    with pytest.raises(ValueError, match=f"^{accent}: problem 'q1' has characters the model's tokenizer cannot"):
        run_cli(accent, tmp_path / "out", "--heldout-per-group", "0")
    assert not (tmp_path / "out").exists()


def test_threads_flag_and_list_ids_in_a_bands_file(tmp_path, monkeypatch):
    import torch
    seen = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: seen.append(n))
    with pytest.raises(ValueError):  # stops at the data (a list id), after --threads took effect
        path = tmp_path / "d.jsonl"
        path.write_text('{"id": ["a"], "problem": "1 + 2", "answer": "3"}\n')
        run_cli(path, tmp_path / "out", "--threads", "1")
    f = write_jsonl(tmp_path / "bands.jsonl", [dict(id=["a"], band="mixed")])
    with pytest.raises(ValueError, match="bands.jsonl:1: 'id' must be a string or an integer, got list"):
        B.read_bands(f)
    path.write_text('{"problem": "1 + 2", "answer": "3"}\n')
    monkeypatch.setattr(B.E, "evaluate", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # reached sampling: --threads was applied before
        run_cli(path, tmp_path / "out2", "--threads", "1", "--heldout-per-group", "0")
    assert seen == [1]


def test_write_jsonl_writes_a_whole_file_or_leaves_the_old_one(tmp_path):
    # runs.write_jsonl (bands, rounds, ladder and looped share it): utf-8 rows, and a failed write keeps the old file
    path = tmp_path / "rows.jsonl"
    runs.write_jsonl(path, [dict(id="q1", problem="1 + \u00e9")])
    assert path.read_bytes() == '{"id": "q1", "problem": "1 + \u00e9"}\n'.encode("utf-8")
    with pytest.raises(TypeError):
        runs.write_jsonl(path, [dict(id="q2"), dict(id=object())])  # a row that is not JSON: nothing written
    assert json.loads(path.read_text(encoding="utf-8"))["id"] == "q1" and not (tmp_path / "rows.jsonl.tmp").exists()
