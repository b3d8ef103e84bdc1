"""guards.py: each guard fires on the metrics that should fire it, and on a tiny run made to go bad (a budget of 8
tokens; a learning rate of 1e-1), as a warning, and with --guard-stop as a stop after a checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import guards

ROOT = Path(__file__).resolve().parents[1]


def cfg(**kw):
    return SimpleNamespace(**dict(dict(guard_steps=3, guard_truncation=0.5, guard_answers=0.5, guard_entropy=0.1,
                                       guard_accuracy=True, guard_stop=False), **kw))


def step(i, truncation=0.0, no_answer=0.0, entropy=1.0, accuracy=0.5):
    return dict(step=i, truncation_rate=truncation, format_failure_rate=no_answer, entropy=entropy, accuracy=accuracy)


def fired(rows, config):
    g = guards.Guards(config)
    return [g.watch(m) for m in rows]


def test_each_guard_fires_after_its_steps_running_once(capsys):
    healthy = [step(1), step(2)]
    assert fired(healthy + [step(i, truncation=0.6) for i in range(3, 7)], cfg()) == \
        [[], [], [], [], ["truncation"], []]  # the third step running fires it, once
    assert fired(healthy + [step(i, no_answer=0.6) for i in range(3, 6)], cfg())[-1] == ["answers"]  # 0.4 < 0.5 x 1
    assert fired(healthy + [step(i, entropy=0.05) for i in range(3, 6)], cfg())[-1] == ["entropy"]
    assert fired(healthy + [step(i, accuracy=0.0) for i in range(3, 6)], cfg())[-1] == ["accuracy"]
    assert "guard: step 5: accuracy 0 for 3 steps after having been above it" in capsys.readouterr().out


def test_a_guard_needs_its_steps_running_and_its_history():
    broken = [step(1, truncation=0.6), step(2), step(3, truncation=0.6), step(4, truncation=0.6)]
    assert fired(broken, cfg()) == [[], [], [], []]  # interrupted by a good step
    assert fired([step(i, accuracy=0.0) for i in range(1, 6)], cfg()) == [[]] * 5  # never above 0: no collapse
    assert fired([step(i, entropy=float("nan")) for i in range(1, 6)], cfg()) == [[]] * 5  # no row trained
    off = cfg(guard_truncation=0, guard_answers=0, guard_entropy=0, guard_accuracy=False)
    assert fired([step(1)] + [step(i, 1.0, 1.0, 0.0, 0.0) for i in range(2, 6)], off) == [[]] * 5


def test_guard_stop_raises_what_train_rl_saves_on():
    g = guards.Guards(cfg(guard_stop=True, guard_steps=1))
    with pytest.raises(guards.Stop) as e:
        g.watch(step(1, truncation=1.0))
    assert isinstance(e.value, KeyboardInterrupt) and "truncation" in str(e.value)


def train(tmp_path, name, *flags):
    out = tmp_path / name
    r = subprocess.run([sys.executable, "train_rl.py", "--model", "tiny", "--steps", "6", "--problems-per-step", "2",
                        "--group-size", "4", "--eval-every", "0", "--save-every", "0", "--test-dataset", "",
                        "--threads", "1", "--guard-steps", "2", "--out", str(out), *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    return r, out


def test_a_budget_of_8_tokens_fires_the_truncation_guard_as_a_warning(tmp_path):
    r, out = train(tmp_path, "b8", "--max-new-tokens", "8", "--steps", "3")
    assert r.returncode == 0, r.stderr
    assert "guard: step 2: truncation_rate 1.00 > 0.5 for 2 steps" in r.stdout
    assert (out / "final").is_dir()  # a warning: the run goes on to its end


def test_a_learning_rate_of_0_1_fires_two_guards_and_guard_stop_saves_a_checkpoint(tmp_path):
    r, out = train(tmp_path, "lr", "--lr", "1e-1", "--guard-stop")
    assert r.returncode == 3, r.stderr
    warnings = [line for line in r.stdout.splitlines() if line.startswith("guard: ")]
    assert [w.split(": ")[2].split(" ")[0] for w in warnings] == ["the", "accuracy"], warnings
    assert "train_rl.py: stopped: guard answers, accuracy fired at step 3 (--guard-stop)" in r.stderr
    metrics = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert (out / "checkpoints" / "step_3" / "model.safetensors").is_file() and not (out / "final").exists()


def test_the_random_reward_control_fires_three_guards(tmp_path):
    # --reward random pays a coin flip: a reward that carries no information about the answer; at lr 1e-2 the policy
    # drifts into endless rollouts without a final answer, and accuracy falls to 0 (the format control no longer
    # moves the tiny model: every rollout already ends in a box, so every group is paid alike)
    r, out = train(tmp_path, "random", "--reward", "random", "--lr", "1e-2", "--problems-per-step", "4", "--steps", "4")
    assert r.returncode == 0, r.stderr
    warnings = [line.split(": ")[2].split(" ")[0] for line in r.stdout.splitlines() if line.startswith("guard: ")]
    assert warnings == ["truncation_rate", "the", "accuracy"], r.stdout
    assert "guard: step 3: accuracy 0 for 2 steps after having been above it" in r.stdout


def test_a_resumed_run_replays_its_logged_steps_and_fires_where_the_straight_run_does(capsys):
    rows = [step(1), step(2, truncation=0.6), step(3, truncation=0.6), step(4, truncation=0.6), step(5, entropy=0.05)]
    straight = fired(rows, cfg())
    for cut in range(1, len(rows)):
        resumed = guards.Guards(cfg(), rows[:cut])  # the logged steps, replayed: no line, no stop
        assert [resumed.watch(m) for m in rows[cut:]] == straight[cut:], cut
    capsys.readouterr()
    guards.Guards(cfg(guard_stop=True), rows[:4])  # a replay never stops, even past a guard that fired then
    assert capsys.readouterr().out == ""


def test_the_truncation_guard_fires_at_the_same_step_after_a_resume(tmp_path):
    r, out = train(tmp_path, "b8", "--max-new-tokens", "8", "--steps", "1")
    assert r.returncode == 0 and "guard:" not in r.stdout, r.stderr
    r, out = train(tmp_path, "b8", "--max-new-tokens", "8", "--steps", "3", "--resume")
    assert r.returncode == 0, r.stderr
    assert "guard: step 2: truncation_rate 1.00 > 0.5 for 2 steps" in r.stdout  # step 1's count came from the log
