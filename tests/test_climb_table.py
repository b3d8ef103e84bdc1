"""climb_table.py: the endpoint, the paired rung-2-6 differences and the trend slope, by hand, from written runs."""

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from research.rounds import climb_table as CT
import runs


def write_run(d, rung7_after_2, mean_by_round, top=10, far=None):
    """A fake climb run: rounds 0-2, rungs 2..top, every rung at the round's mean except rung 7 after round 2 (and
    the rungs past 10 at far, where given)."""
    d.mkdir()
    climb, test = [], []
    for r, m in enumerate(mean_by_round):
        fast = {str(k): m if k <= 10 or far is None else far for k in range(2, top + 1)}
        by_rung = dict(fast)
        if r == 2:
            by_rung["7"] = rung7_after_2
        climb.append(dict(round=r, cumulative_flops=1e12 * r, rung=5 + r, problems_labelled=10, solved=8,
                          fast_by_rung=fast, vote_rung=6 + r, vote_accuracy=0.1 * r,
                          mix_by_rung={str(5 + r): 8, "2": 8}, token_share_by_rung={str(5 + r): 0.6},
                          loss_share_first_by_rung=None, loss_share_last_by_rung={str(5 + r): 0.5}, updates=3,
                          deliberation_flops=1e11, distillation_flops=2e11))
        test.append(dict(round=r, rung=5 + r if r else None, fast_by_rung=by_rung, fast_n=len(by_rung) * 200,
                         vote_by_rung=by_rung, reach={"6": dict(pass_at_1=0.1, pass_at_k=0.5, first_errors={"line 1 carry": 1.0})},
                         reach_samples=64))
    runs.write_jsonl(d / "climb.jsonl", climb)
    runs.write_jsonl(d / "test.jsonl", test)


def test_endpoint_kept_and_trend_by_hand(tmp_path, capsys):
    for i, (end, means) in enumerate([(0.4, [0.1, 0.2, 0.3]), (0.5, [0.1, 0.3, 0.5]), (0.6, [0.1, 0.1, 0.1])]):
        write_run(tmp_path / f"s{i}", end, means)
    CT.main([f"climb={tmp_path}/s?"])
    text = capsys.readouterr().out
    half = 4.303 * 0.1 / math.sqrt(3)  # t(0.975, 2 df) x sd / sqrt(3) over 0.4, 0.5, 0.6
    wide = 4.303 * math.sqrt(0.01 / 3 + 0.5 * 0.5 / 200)  # and the 200 test problems' binomial error
    assert f"| climb | 3 | 0.500 [{0.5 - half:.3f}, {0.5 + half:.3f}] | 0.500 [{0.5 - wide:.3f}, {0.5 + wide:.3f}] " \
           f"| yes |" in text
    # round 2 minus round 0 at rung 2: +0.2, +0.4, 0.0 -> mean 0.2, sd 0.2
    half = 4.303 * 0.2 / math.sqrt(3)
    assert f"| climb | 2 | 0.200 [{0.2 - half:.3f}, {0.2 + half:.3f}] |" in text
    # slopes of the mean over rungs 2-10 against rounds 0-2 (rung 7 moves round 2's mean by (end - m) / 9)
    slopes = []
    for end, means in [(0.4, [0.1, 0.2, 0.3]), (0.5, [0.1, 0.3, 0.5]), (0.6, [0.1, 0.1, 0.1])]:
        y = [means[0], means[1], means[2] + (end - means[2]) / 9]
        slopes.append((y[2] - y[0]) / 2)  # three equally spaced points: the slope is (last - first) / 2
    assert " / ".join(f"{s:+.3f}" for s in slopes) in text
    assert "| climb | 2 | 7 | 10 | 8 | 7: 8, 2: 8 | 0.60 / - / 0.50 | 3 | 1.00e+11 | 2.00e+11 |" in text
    # validation: round 1's rung-2 mean over the seeds' 0.2, 0.3, 0.1 and its vote 0.1
    assert "| climb | 1 | 3 | 1.00e+12 | 0.20 |" in text and "| rung 7: 0.10 |" in text


def test_moonshot_on_the_mean_and_seed_by_seed_by_hand(tmp_path, capsys):
    # seed 0 misses (rung 9 at 0.45), seed 1 meets it; the means (rung 10 0.45, rung 9 0.525) meet it
    for i, (top, nine) in enumerate([(0.4, 0.45), (0.5, 0.6)]):
        d = tmp_path / f"s{i}"
        d.mkdir()
        rows = []
        for r in range(6):
            fast = {str(k): 0.7 for k in range(2, 11)}
            fast.update({"9": nine, "10": top} if r == 5 else {})
            rows.append(dict(round=r, rung=5 + r if r else None, fast_by_rung=fast, reach={}, reach_samples=64,
                             vote_by_rung={str(k): 0.1 * (k - 6) + 0.1 * i for k in range(2, 11)}))
        runs.write_jsonl(d / "test.jsonl", rows)
        runs.write_jsonl(d / "climb.jsonl", [])
    CT.moonshot_table(CT.load([f"climb={tmp_path}/s?"]))
    row = capsys.readouterr().out.strip().splitlines()[-1]
    # rung 10 over 0.4, 0.5: t(0.975, 1 df) = 12.706 x sd 0.0707 / sqrt(2) = 0.635
    assert row.startswith("| climb | 2 | 0.45 [-0.19, 1.09] | 0.53 [") and "(rung 9) | yes, 1 of 2 seeds |" in row
    assert "0.40 / 0.45 (9) ; 0.50 / 0.60 (9)" in row
    # after round r the next rung is 6 + r; its vote is 0.1 r (seed 0) and 0.1 r + 0.1 (seed 1): mean 0.1 r + 0.05
    assert row.endswith("| 0.05 / 0.15 / 0.25 / 0.35 / 0.45 |")


def test_runs_are_never_dropped_silently_each_case_one_error_line(tmp_path):
    """An arm named twice, a glob that also matches a stray file or only empty directories, a damaged climb.jsonl:
    one `climb_table.py: error:` line naming it, exit 2 (each printed tables without those runs, exit 0)."""
    for i in range(2):
        write_run(tmp_path / f"s{i}", 0.4, [0.1, 0.2, 0.3])
    (tmp_path / "s_notes.txt").write_text("a user's file\n")
    (tmp_path / "e1").mkdir()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "climb.jsonl").write_text('{"round": 0}\nnot json\n{"round": 1}\n')
    cases = [([f"a={tmp_path}/s0", f"a={tmp_path}/s1"], "arm 'a' is named twice"),
             ([f"a={tmp_path}/s*"], f"{tmp_path}/s_notes.txt: not a directory"),
             ([f"a={tmp_path}/e?"], f"{tmp_path}/e1: no climb.jsonl"),
             ([f"a={tmp_path}/bad"], f"{tmp_path}/bad/climb.jsonl:2: not a JSON object")]
    cases += [([f"a={tmp_path}/s?", "--baseline", "b"], "--baseline b: not an arm; the arms are a"),
              ([f"a={tmp_path}/s?", "--baseline"], "--baseline: want an arm's name")]
    for argv, said in cases:
        with pytest.raises(ValueError, match=re.escape(said)):
            CT.main(argv)
    r = subprocess.run([sys.executable, str(Path(CT.__file__)), f"a={tmp_path}/none*"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"climb_table.py: error: 'a={tmp_path}/none*': want ARM=GLOB matching climb run directories"]


def test_erosion_the_next_rung_and_the_labels_by_hand(tmp_path, capsys):
    """Two seeds, rounds 0-3 (rungs 6, 7, 8): each rung against its own round, System 1 and the vote at the rung
    the next round labels, and each round's labels with their offline precision, all from hand-written rows."""
    fast = [  # per seed, per round: {rung: greedy accuracy}; other rungs 0.5
        [{"6": 0.0, "7": 0.0}, {"6": 0.6, "7": 0.1}, {"3": 0.4, "6": 0.5, "7": 0.8, "8": 0.05},
         {"3": 0.3, "6": 0.4, "7": 0.6, "8": 0.7}],
        [{"6": 0.0, "7": 0.0}, {"6": 0.7, "7": 0.0}, {"6": 0.4, "7": 0.9, "8": 0.15}, {"6": 0.7, "7": 0.9, "8": 0.8}]]
    for i, by_round in enumerate(fast):
        d = tmp_path / f"s{i}"
        d.mkdir()
        rows = []
        for r, acc in enumerate(by_round):
            labels = dict(key=dict(kept=10 + i, problems=10, precision_steps=1.0, precision_answer=1.0) if r < 3 else
                          dict(kept=0, problems=0, precision_steps=None, precision_answer=None),
                          answer=dict(kept=20, problems=20, precision_steps=0.5 + 0.1 * i, precision_answer=1.0),
                          vote=dict(kept=30, problems=30, precision_steps=0.4, precision_answer=0.6 + 0.2 * i))
            rows.append(dict(round=r, rung=5 + r if r else None, vote_rung=6 + r, vote_accuracy=0.3 + 0.1 * i,
                             fast_by_rung={str(k): acc.get(str(k), 0.5) for k in range(2, 11)}, cumulative_flops=0.0,
                             problems_labelled=40, label_source="answer", labels_by_source=labels if r else None))
        rows[0].update(base_rungs=[2, 3, 4, 5], base_problems_labelled=16, base_labels_by_source=rows[1][
            "labels_by_source"])  # climb.py --base-labels own: pi_0 labelled the rungs below rung 6 in round 0
        runs.write_jsonl(d / "climb.jsonl", rows)
        runs.write_jsonl(d / "test.jsonl", [dict(row, vote_by_rung=row["fast_by_rung"]) for row in rows[:3]])
    arms = CT.load([f"a={tmp_path}/s?"])
    capsys.readouterr()
    CT.erosion_table(arms, 0, "validation")
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[2] == "| arm | round | rung 2 | rung 3 | rung 4 | rung 5 | rung 6 | rung 7 | rung 8 |"

    def pair(x, y):  # the mean of two seeds' differences and its 95% t interval (12.706 x sd / sqrt(2))
        half = 12.706 * abs(x - y) / 2
        return f"{(x + y) / 2:.3f} [{(x + y) / 2 - half:.3f}, {(x + y) / 2 + half:.3f}]"
    # rung 6 (round 1's): round 2 -0.1 / -0.3, round 3 -0.2 / 0.0; rung 7 (round 2's): round 3 -0.2 / 0.0;
    # rungs 2-5 against round 1 (0.5): rung 3 round 2 -0.1 / 0.0, round 3 -0.2 / 0.0, the others 0
    kept = pair(0.0, 0.0)
    assert lines[4:] == [f"| a | 2 | {kept} | {pair(-0.1, 0.0)} | {kept} | {kept} | {pair(-0.1, -0.3)} | - | - |",
                         f"| a | 3 | {kept} | {pair(-0.2, 0.0)} | {kept} | {kept} | {pair(-0.2, 0.0)} | "
                         f"{pair(-0.2, 0.0)} | - |"]
    CT.erosion_table(arms, 1, "test")  # tested through round 2 only: rungs 2-6 in round 2
    assert capsys.readouterr().out.strip().splitlines()[4:] == [
        f"| a | 2 | {kept} | {pair(-0.1, 0.0)} | {kept} | {kept} | {pair(-0.1, -0.3)} | - |"]
    CT.next_rung_table(arms)
    lines = capsys.readouterr().out.strip().splitlines()
    # after round r, rung 6 + r: System 1 0.0 / 0.0, 0.1 / 0.0, 0.05 / 0.15, 0.5 / 0.5; the vote 0.3 / 0.4
    vote = "0.35 [-0.29, 0.99]"
    assert lines[4:] == [f"| a | 0 | 6 | 0.00 [0.00, 0.00] | {vote} | 0.00 | 0.00 | - | - |",
                         f"| a | 1 | 7 | 0.05 [-0.59, 0.69] | {vote} | 0.05 | 0.05 | - | - |",
                         f"| a | 2 | 8 | 0.10 [-0.54, 0.74] | {vote} | 0.10 | 0.10 | - | - |",
                         f"| a | 3 | 9 | 0.50 [0.50, 0.50] | {vote} | - | - | - | - |"]
    CT.labels_table(arms)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 8  # title, header and rounds 0-3
    same = "20 | 0.550 [-0.085, 1.185] | 1.000 [1.000, 1.000] | 10 (1.000 / 1.000) | 20 (0.550 / 1.000) | " \
           "30 (0.400 / 0.700) |"
    assert lines[4] == f"| a | 0 | 2-5 | answer | 16 | {same}"  # the base replay's labels, rungs 2-5
    assert lines[5] == f"| a | 1 | 6 | answer | 40 | {same}"
    assert lines[7].endswith("| 0 (- / -) | 20 (0.550 / 1.000) | 30 (0.400 / 0.700) |")  # nothing kept: no precision


def test_the_next_rungs_first_errors_and_lines_from_the_evaluation_records_by_hand(tmp_path, capsys):
    """System 1's failed greedy answers at the next rung, pooled over two seeds, each named by the first line that
    leaves the problem's chain; and the line count most answers write, from round_r/eval/fast/records.jsonl."""
    # tiny_ladder_far_val/00000 is (97 - 35 + 27 - 37 + 24 - 68) * 6 - 19 = 29, a rung-7 validation problem
    right = "97 - 35 = 62\n62 + 27 = 89\n89 - 37 = 52\n52 + 24 = 76\n76 - 68 = 8\n8 * 6 = 48\n48 - 19 = 29\n"
    short = right.split("48 - 19")[0] + "\\boxed{48}"  # six lines, then the box: stops at line 7
    skips = "35 + 27 = 62\n" + right.split("\n", 1)[1] + "\\boxed{29}"  # line 1 starts from the second number
    records = [  # per seed: (id, rung, correct, response); seed 0's rung-6 answer is not at the next rung
        [("tiny_ladder_far_val/00000", 7, True, right + "\\boxed{29}"), ("x/1", 6, False, short)],
        [("tiny_ladder_far_val/00000", 7, False, short), ("tiny_ladder_far_val/00002", 7, False, skips)]]
    for i, seed in enumerate(records):
        d = tmp_path / f"s{i}"
        (d / "round_1" / "eval" / "fast").mkdir(parents=True)
        fast = {str(k): 0.5 for k in range(2, 11)}
        runs.write_jsonl(d / "climb.jsonl", [dict(round=r, rung=5 + r if r else None, vote_rung=6 + r,
                                                  vote_accuracy=0.5, fast_by_rung=fast) for r in (0, 1)])
        runs.write_jsonl(d / "round_1" / "eval" / "fast" / "records.jsonl",
                         [dict(id=x, level=k, correct=c, response=text) for x, k, c, text in seed])
    assert CT.greedy_first_errors([tmp_path / "s0", tmp_path / "s1"], 0, 7) == ("-", "-")  # round 0 has no records
    # seed 0: its rung-7 answer is right (the other record is rung 6); seed 1: one stops after six lines, one
    # starts from the wrong number (00002 is (24 * 4 - 2 - 73 + 12) * 3 - 36 - 62: line 1 "35 + 27" carries nothing)
    errors, lines = CT.greedy_first_errors([tmp_path / "s0", tmp_path / "s1"], 1, 7)
    assert errors == "line 7 stopped 0.50; line 1 carry 0.50"
    assert lines == "7 (0.67)"  # seven lines in the right and the skipping answers, six in the short one
    dirs = CT.run_dirs([f"a={tmp_path}/s?"])
    CT.next_rung_table(CT.load([f"a={tmp_path}/s?"]), dirs)
    row = capsys.readouterr().out.strip().splitlines()[-1]
    assert row.startswith("| a | 1 | 7 |")
    assert row.endswith("| - | - | line 7 stopped 0.50; line 1 carry 0.50 | 7 (0.67) |")


def test_erosion_paired_by_problem_and_seed_from_the_evaluation_records_by_hand(tmp_path, capsys):
    """After the last round (2), each rung below it against its own round (rungs 2-6 against round 1), from two
    seeds' records: the difference over the (seed, problem) pairs, its interval, and the problems lost and gained."""
    scores = {  # per seed, per round: {rung: 0/1 per problem}; rung 7 is round 2's own rung (no row)
        0: {1: {2: [1, 1, 1, 0], 3: [1, 1, 0, 0], 6: [0, 0, 0, 0], 7: [0, 0]},
            2: {2: [1, 0, 1, 1], 3: [1, 1, 0, 0], 6: [1, 1, 1, 1], 7: [1, 1]}},
        1: {1: {2: [1, 1, 1, 1], 3: [0, 1, 0, 1], 6: [0, 0, 0, 0], 7: [0, 0]},
            2: {2: [0, 0, 1, 1], 3: [0, 1, 0, 1], 6: [1, 1, 1, 1], 7: [1, 1]}}}
    for i, by_round in scores.items():
        d = tmp_path / f"s{i}"
        d.mkdir()
        runs.write_jsonl(d / "climb.jsonl", [dict(round=r, rung=5 + r if r else None, vote_rung=6 + r,
                                                  fast_by_rung={k: 0.5 for k in ("2", "3", "6", "7")})
                                             for r in (0, 1, 2)])
        for r, by_rung in by_round.items():
            (d / f"round_{r}" / "eval" / "fast").mkdir(parents=True)
            runs.write_jsonl(d / f"round_{r}" / "eval" / "fast" / "records.jsonl",  # written in a shuffled order
                             [dict(id=f"p{k}-{j}", level=k, correct=bool(c))
                              for k, xs in reversed(by_rung.items()) for j, c in reversed(list(enumerate(xs)))])
    arms, dirs = CT.load([f"a={tmp_path}/s?"]), CT.run_dirs([f"a={tmp_path}/s?"])
    capsys.readouterr()
    CT.paired_erosion_table(arms, dirs, 0, "validation")
    rows = {int(line.split("|")[3]): line for line in capsys.readouterr().out.strip().splitlines()[4:]}
    assert sorted(rows) == [2, 3, 6]  # rung 7's own round is the last
    # rung 2: seed 0 loses one and gains one, seed 1 loses two: 8 pairs, -2 / 8; rung 3 unchanged; rung 6 all gained
    assert rows[3] == "| a | 2 | 3 | 1 | 0.000 [0.000, 0.000] | 8 | 0 / 0 |"
    assert rows[6] == "| a | 2 | 6 | 1 | 1.000 [1.000, 1.000] | 8 | 0 / 8 |"
    diff, lo, hi = map(float, re.search(r"\| (\S+) \[(\S+), (\S+)\] \| 8 \| 3 / 1 \|", rows[2]).groups())
    sd = math.sqrt(4 / 8 - 0.25 ** 2)  # the pairs' differences: three -1, one +1, four 0
    assert diff == -0.25 and abs(lo - (-0.25 - 1.96 * sd / math.sqrt(8))) < 0.15 \
        and abs(hi - (-0.25 + 1.96 * sd / math.sqrt(8))) < 0.15  # the bootstrap's percentiles, near the normal's
    (tmp_path / "s1" / "round_2" / "eval" / "fast" / "records.jsonl").unlink()  # a round without records: no interval
    CT.paired_erosion_table(arms, dirs, 0, "validation")
    assert "| a | 2 | 2 | 1 | - | - | - |" in capsys.readouterr().out
    runs.write_jsonl(tmp_path / "s1" / "round_2" / "eval" / "fast" / "records.jsonl",
                     [dict(id="other", level=2, correct=True)])
    with pytest.raises(ValueError, match="rounds 1 and 2 evaluated different problems at rung 2"):
        CT.paired_erosion_table(arms, dirs, 0, "validation")


def test_goals_3_and_2_by_their_pre_registered_rules_by_hand(tmp_path, capsys):
    """Three seeds, rounds 0-3 on test (200 problems a rung): System 1 at the next rung against 0.30 with the test
    set's error, and after round 3 each rung against its own round against -0.02."""
    next_rung = {1: [0.4, 0.4, 0.4], 2: [0.2, 0.3, 0.4], 3: [0.35, 0.35, 0.35]}  # rungs 7, 8, 9 after rounds 1-3
    for i in range(3):
        d = tmp_path / f"s{i}"
        d.mkdir()
        rows = []
        for r in range(4):
            fast = {str(k): 0.5 for k in range(2, 10)}
            fast.update({"7": 0.8} if r == 2 else {"7": [0.78, 0.77, 0.78][i], "3": 0.48} if r == 3 else {})
            if r:
                fast[str(6 + r)] = next_rung[r][i]
            rows.append(dict(round=r, rung=5 + r if r else None, fast_by_rung=fast, fast_n=len(fast) * 200))
        runs.write_jsonl(d / "climb.jsonl", rows)
        runs.write_jsonl(d / "test.jsonl", rows)
    CT.goals_table(CT.load([f"a={tmp_path}/s?"]))
    lines = capsys.readouterr().out.strip().splitlines()
    goal3 = [line for line in lines if line.startswith("| a |")][:3]

    def with_items(values):  # mean, t(0.975, 2 df) x sqrt(s^2 / 3 + p (1 - p) / 200)
        m = sum(values) / 3
        s2 = sum((x - m) ** 2 for x in values) / 2
        half = 4.303 * math.sqrt(s2 / 3 + m * (1 - m) / 200)
        return f"{m:.3f} [{m - half:.3f}, {m + half:.3f}]"
    assert goal3[0].endswith(f"| 1 | 7 | 0.400 [0.400, 0.400] | {with_items([0.4] * 3)} | yes |")  # lower 0.251
    assert goal3[1].endswith(f"| 2 | 8 | 0.300 [0.052, 0.548] | {with_items([0.2, 0.3, 0.4])} | no |")  # lower 0.015
    assert goal3[2].endswith(f"| 3 | 9 | 0.350 [0.350, 0.350] | {with_items([0.35] * 3)} | yes |")
    # after round 3: rung 7 (round 2's own, 0.8) at 0.78 / 0.77 / 0.78 falls 0.023 on the mean; rung 3 exactly 0.02
    # (0.5 -> 0.48, round 1's), not below; rung 8 is round 3's own rung, so rungs 2-7 are read
    assert lines[-1] == "| a | 3 | 2-7 | -0.023 (7) | 7: -0.023 | no |"
    assert "a: goal 3 met at rounds 1, 3 of 1-4; the goal is not met" in lines  # round 2 missed, round 4 not run
    for i in range(3):  # round 2 raised to 0.40 and a round 4 at 0.40: every round 1-4 met
        rows = runs.read_log(tmp_path / f"s{i}" / "test.jsonl")
        rows[2]["fast_by_rung"]["8"] = 0.4
        rows.append(dict(rows[3], round=4, rung=9, fast_by_rung=dict(rows[3]["fast_by_rung"], **{"10": 0.4})))
        runs.write_jsonl(tmp_path / f"s{i}" / "climb.jsonl", rows)
        runs.write_jsonl(tmp_path / f"s{i}" / "test.jsonl", rows)
    CT.goals_table(CT.load([f"a={tmp_path}/s?"]))
    assert "a: goal 3 met at rounds 1, 2, 3, 4 of 1-4; the goal is met" in capsys.readouterr().out.splitlines()


def test_each_arm_minus_the_baseline_paired_by_seed_by_hand(tmp_path, capsys):
    """climb_table.py --baseline: round r's rung and the mean over rungs 2-10, each seed's arm minus the same seed's
    baseline; the FLOPs of both."""
    for i, end in enumerate([0.4, 0.5, 0.6]):  # the arm's rung 7 after round 2; the baseline's 0.1, 0.1, 0.4
        write_run(tmp_path / f"a{i}", end, [0.1, 0.2, 0.3])
        write_run(tmp_path / f"b{i}", [0.1, 0.1, 0.4][i], [0.1, 0.2, 0.3])
        rows = runs.read_log(tmp_path / f"b{i}" / "climb.jsonl")  # as --learner scaffold writes them: no shares
        runs.write_jsonl(tmp_path / f"b{i}" / "climb.jsonl", [{k: v for k, v in r.items() if "share" not in k}
                                                              for r in rows])
    CT.main([f"arm={tmp_path}/a?", f"base={tmp_path}/b?", "--baseline", "base"])
    text = capsys.readouterr().out
    assert "| base | 2 | 7 | 10 | 8 | 7: 8, 2: 8 | - / - / - | 3 | 1.00e+11 | 2.00e+11 |" in text
    d = [0.3, 0.4, 0.2]  # at rung 7: sd 0.1; over rungs 2-10 the same differences / 9
    half = 4.303 * 0.1 / math.sqrt(3)
    over = 4.303 * 0.1 / 9 / math.sqrt(3)
    assert (f"| arm | 2 | 7 | 0.300 [{0.3 - half:.3f}, {0.3 + half:.3f}] | {0.3 / 9:.3f} [{0.3 / 9 - over:.3f}, "
            f"{0.3 / 9 + over:.3f}] | 2.00e+12 / 2.00e+12 |") in text and sum(d) / 3 == pytest.approx(0.3)
    assert "| arm | 1 | 6 | 0.000 [0.000, 0.000] | 0.000 [0.000, 0.000] | 1.00e+12 / 1.00e+12 |" in text
    assert "| base | 1 |" not in text.split("Paired by seed")[1].split("\n\n")[1]  # the baseline is not paired with itself


def test_a_run_past_rung_10_adds_its_columns_and_the_means_keep_to_the_rungs_every_run_has(tmp_path, capsys):
    """An arm that evaluates rungs 2-12 (a climb labelling past rung 10) beside one that stops at 10: rungs 11-12
    get columns, '-' where a run has no value, and every "mean" column stays over rungs 2-10 (no arm's mean takes
    rungs the other never ran)."""
    for i in range(2):
        write_run(tmp_path / f"a{i}", 0.5, [0.5, 0.5, 0.5])
        write_run(tmp_path / f"b{i}", 0.5, [0.5, 0.5, 0.5], top=12, far=0.9)
    CT.main([f"short={tmp_path}/a?", f"long={tmp_path}/b?", "--baseline", "short"])
    text = capsys.readouterr().out
    header = "| arm | round | rung | FLOPs (mean) | mean 2-10 | " + " | ".join(f"rung {k}" for k in range(2, 13)) + " |"
    assert text.count(header) == 2  # the greedy and the vote table
    assert "| short | 1 | 6 | 1.00e+12 | 0.500 [0.500, 0.500] | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 [0.50, 0.50] | " \
           "0.50 | 0.50 | 0.50 | 0.50 | - | - |" in text
    assert "| long | 1 | 6 | 1.00e+12 | 0.500 [0.500, 0.500] | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 [0.50, 0.50] | " \
           "0.50 | 0.50 | 0.50 | 0.50 | 0.90 | 0.90 |" in text
    assert "| long | 2 | 7 | 0.000 [0.000, 0.000] | 0.000 [0.000, 0.000] |" in text  # paired over rungs 2-10 only
    assert "slope of mean greedy accuracy over rungs 2-10" in text
    assert "| long | 2 | 0.500 [0.500, 0.500] | 0.500 [0.051, 0.949] | yes |" in text  # 200 test problems a rung
    assert "| long | 2 | 2 | 2.00e+12 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.50 | 0.90 | 0.90 | " \
           "rung 8: 0.20 |" in text  # validation: every rung the run has
