import json
import math

import pytest
import torch

import curriculum as C
import train_rl as T
from train_rl import Config
import checkpoint
import objectives


def group(pid, passes):
    return [T.Rollout(problem=dict(id=pid), prompt=[1, 2], tokens=[3, 4, 5], text=f"{pid}-{j}", finish_reason="stop",
                      sampler_logprobs=[-.5, -.25, -1.], seed=0, sample=j, correct=bool(ok), boxed=True,
                      passed=bool(ok), reward=float(ok))
            for j, ok in enumerate(passes)]


# -----------------------------------------------------------------------------
# The pass-rate table


def test_pass_rate_weights_and_skips_on_a_fixed_history():
    table = C.PassRates(["a", "b", "c", "d"], floor=0.01, skip_window=2)
    table.update([group("a", [1, 0, 0, 0]), group("b", [1, 1, 1, 1]), group("c", [0, 0, 0, 0])])
    table.update([group("b", [1, 1, 1, 1]), group("c", [1, 0, 0, 0])])
    # a: s=1 of n=4 -> p = 2/6; b: 8 of 8 -> p = 9/10, but its last two groups were all right: skipped;
    # c: 1 of 8 -> p = 2/10, last groups 0 and 1/4: not skipped; d never drawn: p = 1/2
    assert table.weights().tolist() == pytest.approx([(2 / 6) * (4 / 6), 0.01, 0.2 * 0.8, 0.25])
    assert [table.skipped(i) for i in range(4)] == [False, True, False, False]
    table.update([group("c", [0, 0, 0, 0]), group("c", [0, 0, 0, 0])])  # two all-wrong groups in a row
    assert table.skipped(2) and table.weights()[2] == 0.01
    assert table.histogram() == dict(unseen=1, zero=0, low=2, mid_low=0, mid_high=0, high=0, one=1)  # a 1/4, c 1/16
    never = C.PassRates(["a"], skip_window=0)
    never.update([group("a", [1, 1]), group("a", [1, 1])])
    assert not never.skipped(0) and never.weights()[0] == pytest.approx(max(5 / 6 * 1 / 6, 0.01))


def test_pass_rate_draws_are_distinct_weighted_seeded_and_exclude():
    table = C.PassRates([f"p{i}" for i in range(5)], floor=0.01)
    for i in range(4):  # p0..p3 always solved twice in a row: skipped, weight 0.01; p4 unseen, weight 0.25
        table.update([group(f"p{i}", [1, 1])] * 2)
    draws = [table.draw(1, torch.Generator().manual_seed(s)) for s in range(400)]
    share = sum(d == [4] for d in draws) / 400
    assert share == pytest.approx(0.25 / (0.25 + 4 * 0.01), abs=0.05)  # 0.86
    two = table.draw(2, torch.Generator().manual_seed(1))
    assert len(set(two)) == 2 and two == table.draw(2, torch.Generator().manual_seed(1))
    assert table.draw(3, torch.Generator().manual_seed(0), exclude={4}) and 4 not in table.draw(
        4, torch.Generator().manual_seed(0), exclude={4})
    assert table.draw(9, torch.Generator().manual_seed(0)) and len(table.draw(9, torch.Generator().manual_seed(0))) == 5
    with pytest.raises(ValueError, match="repeats ids"):
        C.PassRates(["a", "a"])


# -----------------------------------------------------------------------------
# The replay buffer


def test_replay_buffer_contents_over_a_fixed_sequence_of_steps():
    buf = C.ReplayBuffer(capacity=2, max_rate=0.25)
    buf.add([group("a", [0, 1, 0, 0]), group("b", [1, 1, 0, 0]), group("c", [0, 0, 0, 0])], step=1)
    assert [(e["id"], e["step"], e["text"]) for e in buf.entries] == [("a", 1, "a-1")]  # b too easy, c unsolved
    buf.add([group("c", [0, 0, 0, 1]), group("d", [1, 0, 0, 0])], step=2)
    assert [(e["id"], e["text"]) for e in buf.entries] == [("c", "c-3"), ("d", "d-0")]  # capacity 2: a evicted
    buf.add([group("c", [1, 1, 0, 0])], step=3)  # c now solved half the time: it leaves
    assert [e["id"] for e in buf.entries] == ["d"]
    assert buf.entries[0]["sampler_logprobs"] == [-.5, -.25, -1.] and buf.entries[0]["pass"]


def test_replay_puts_a_success_in_place_of_a_fresh_wrong_sample():
    buf = C.ReplayBuffer(capacity=8)
    buf.add([group("a", [1, 0, 0, 0]), group("b", [0, 1, 0, 0]), group("b", [0, 0, 1, 0])], step=1)
    groups = [group("a", [1, 0, 0, 0]), group("b", [0, 0, 0, 0]), group("z", [0, 0, 0, 0]), group("a", [1, 1, 1, 1])]
    assert buf.apply(groups, fraction=0.25) == 1  # one of 4 groups: b first (no fresh success), z has no entry
    assert [r.passed for r in groups[1]] == [False, False, False, True]
    assert groups[1][3].replayed and groups[1][3].text == "b-2"
    assert groups[1][3].behavior_logprobs == [-.5, -.25, -1.]  # the policy that sampled it (train_rl.old_logprobs)
    assert not any(r.replayed or r.behavior_logprobs for g in (groups[0], groups[2], groups[3]) for r in g)
    assert buf.apply(groups, fraction=1.0) == 2  # then a; its all-right twin needs nothing
    assert [r.passed for r in groups[0]] == [True, False, False, True] and groups[0][3].text == "a-0"


class FakeTokenizer:
    pad_id = 0


def test_a_replayed_rollout_is_weighted_by_its_clipped_ratio_to_the_sampler(char_model_dir):
    """Its old log-probs are the ones it was sampled with: ratio e^-0.1 scales the gradient by e^-0.1 (inside
    the clip range); ratio e^0.5 > 1 + 0.2 with a positive advantage gives no gradient at all (PPO's clip)."""
    import model as M
    policy = checkpoint.load_model(char_model_dir, device="cpu")
    cfg = Config(objective="drgrpo", max_new_tokens=8, micro_batch_tokens=200, lr=0.0, grad_clip=0.0)
    prompt, tokens = [5, 6, 7], [8, 9, 10, 11]
    with torch.no_grad():
        logp, _ = M.token_logprobs(policy, torch.tensor([prompt + tokens]))
    now = logp[0, len(prompt) - 1:].tolist()

    def grads(shift, replayed):
        sampled = [x + shift for x in now]
        row = T.Rollout(problem={}, prompt=prompt, tokens=tokens, text="", finish_reason="stop", sampler_logprobs=sampled,
                        seed=0, sample=0, advantage=1.0, replayed=replayed, behavior_logprobs=sampled if replayed else None)
        policy.zero_grad()
        opt = torch.optim.SGD(policy.parameters(), lr=0.0)
        opt.zero_grad = lambda set_to_none=True: None  # keep the gradients for the test to read
        T.policy_update(T.Run(cfg, policy, policy, None, opt, FakeTokenizer(), [], "cpu", {}), [row], 1, len(tokens))
        return torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None])

    fresh = grads(0.1, replayed=False)  # a fresh rollout ignores the sampler's log-probs (ratio 1)
    assert torch.allclose(grads(0.1, replayed=True), math.exp(-0.1) * fresh, rtol=1e-4, atol=1e-9)
    assert grads(-0.5, replayed=True).abs().max() == 0


# -----------------------------------------------------------------------------
# The pass@k advantage and the controls


def test_passk_advantages_hand_values():
    adv = objectives.passk_advantages(torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool), 2)
    # N=4, c=1, k=2: rho = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2; right (1/2)/(1/2) = 1,
    # wrong (1 - 1/2 - C(2,1)/C(3,1)) / (1/2) = -1/3
    assert adv[0].tolist() == pytest.approx([1, -1 / 3, -1 / 3, -1 / 3])
    assert adv[1].tolist() == [0, 0, 0, 0] and adv[2].tolist() == [0, 0, 0, 0]  # all right, all wrong
    # c=2: rho = 1 - C(2,2)/C(4,2) = 5/6, sigma = sqrt(5/36); right (1/6)/sigma, wrong (1/6 - C(1,1)/C(3,1))/sigma
    s = math.sqrt(5 / 36)
    assert adv[3].tolist() == pytest.approx([1 / 6 / s, 1 / 6 / s, (1 / 6 - 1 / 3) / s, (1 / 6 - 1 / 3) / s])
    k1 = objectives.passk_advantages(torch.tensor([[1, 0, 0, 0]], dtype=torch.bool), 1)  # k = 1: GRPO with the population std
    p = 0.25
    assert k1[0].tolist() == pytest.approx([(1 - p) / math.sqrt(p * (1 - p))] + [-p / math.sqrt(p * (1 - p))] * 3)
    for k in (0, 4, 5):  # one rule (objectives.check_passk): 1 <= k < N; at k = N rho = 1 and nothing is learnt
        with pytest.raises(ValueError, match="--passk-k"):
            objectives.passk_advantages(torch.zeros(1, 4, dtype=torch.bool), k)
    big = objectives.passk_advantages(torch.tensor([[True] * 3 + [False] * 253]), 64)  # exact binomials at N = 256
    assert torch.isfinite(big).all() and big[0, 0] > 0 > big[0, -1]


def test_the_format_control_pays_any_box_and_accuracy_stays_true():
    """Rollouts through the reward table (reward.score): passed and reward follow the control, correct the verifier."""
    cfg = Config(reward="format", format_penalty=0.2, max_new_tokens=16)
    rollouts = [T.Rollout(problem=dict(problem="1 + 1", answer="2"), prompt=[], tokens=[1] * 4, text=t,
                          finish_reason="stop", sampler_logprobs=[0.0] * 4, seed=3, sample=j)
                for j, t in enumerate(["\\boxed{2}", "\\boxed{3}", "no answer"])]
    T.reward.score(rollouts, cfg)
    assert [(r.correct, r.passed, r.reward) for r in rollouts] == [(True, True, 1.0), (False, True, 1.0),
                                                                   (False, False, 0.0)]


# -----------------------------------------------------------------------------
# In the loop: flags, metrics, and an exact resume with both on


def test_curriculum_and_replay_in_the_loop_resume_exactly(tmp_path, char_model_dir, monkeypatch):
    monkeypatch.setattr(T.verify, "grade_batch", lambda texts, refs: [len(t) % 3 == 0 for t in texts])
    data = tmp_path / "pool.jsonl"
    data.write_text("".join(json.dumps(dict(id=f"p{i}", problem=f"What is {i} + {i}?", answer=str(2 * i))) + "\n"
                            for i in range(6)))

    def cfg(**kw):
        return Config(**dict(dict(model=str(char_model_dir), dataset=str(data), subject="", num_problems=0, val_size=0,
                                  steps=4, problems_per_step=3, group_size=4, max_new_tokens=8, lr=1e-2, device="cpu",
                                  save_every=2, micro_batch_tokens=200, select="pass_rate", replay_fraction=1.0,
                                  replay_max_rate=0.5, objective="passk", passk_k=2), **kw))
    straight = T.train(cfg(out=str(tmp_path / "straight")))
    rows = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    assert sum(rows[-1]["pass_rate_histogram"].values()) == 6 and rows[-1]["pass_rate_histogram"]["unseen"] < 6
    assert all("replayed_groups" in r and r["replay_buffer"] >= 0 for r in rows)
    assert any(r["replayed_groups"] > 0 for r in rows)  # replay happened, so the resume below covers it
    saved = json.loads((straight / "checkpoints/step_4/selection.json").read_text())
    assert sum(saved["pass_rates"]["attempts"]) == 4 * 3 * 4 and "entries" in saved["replay"]
    real_step = T.rl_step

    def dies(run, step, totals):  # killed during step 4, after the step-2 checkpoint
        if step == 3:
            raise RuntimeError("killed")
        return real_step(run, step, totals)
    monkeypatch.setattr(T, "rl_step", dies)
    with pytest.raises(RuntimeError):
        T.train(cfg(out=str(tmp_path / "killed")))
    monkeypatch.setattr(T, "rl_step", real_step)
    resumed = T.train(cfg(out=str(tmp_path / "killed"), resume=True))
    from safetensors.torch import load_file
    wa, wb = load_file(str(straight / "final/model.safetensors")), load_file(str(resumed / "final/model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)

    def steady(path):
        return [{k: v for k, v in json.loads(x).items() if "second" not in k} for x in
                (path / "metrics.jsonl").read_text().splitlines()]
    assert steady(resumed) == steady(straight)


def test_bad_selection_flags_name_the_flag():
    for kw, flag in [(dict(select="hardest"), "--select"), (dict(reward="coin"), "--reward"),
                     (dict(replay_fraction=1.5), "--replay-fraction"), (dict(pass_rate_floor=0.0), "--pass-rate-floor"),
                     (dict(replay_size=0), "--replay-size"), (dict(objective="passk", passk_k=9, group_size=8), "--passk-k"),
                     (dict(objective="passk", passk_k=8, group_size=8), "--passk-k")]:
        with pytest.raises(ValueError, match=flag):
            T.check_config(Config(**kw))


def test_kill_9_then_resume_is_bit_identical_with_curriculum_and_replay(tmp_path):
    """A real SIGKILL of train_rl.py on the tiny world (real grading) after its step-2 checkpoint, then --resume:
    the same weights and the same logged steps as a run never killed."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path
    from safetensors.torch import load_file
    root = Path(T.__file__).resolve().parent
    flags = ["--model", "tiny", "--steps", "5", "--problems-per-step", "3", "--group-size", "4", "--max-new-tokens", "24",
             "--num-problems", "4", "--save-every", "2", "--eval-every", "0", "--test-dataset", "", "--device", "cpu",
             "--select", "pass_rate", "--replay-fraction", "1.0", "--replay-max-rate", "0.75", "--lr", "1e-3"]
    run = lambda out, *more: subprocess.Popen([sys.executable, "train_rl.py", *flags, "--out", str(out), *more],  # noqa: E731
                                              cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    straight = run(tmp_path / "straight")
    assert straight.wait(timeout=300) == 0, straight.stderr.read()
    victim = run(tmp_path / "killed")
    deadline = time.time() + 300
    while not (tmp_path / "killed/checkpoints/step_2").is_dir():
        assert victim.poll() is None and time.time() < deadline, "the run ended before its step-2 checkpoint"
        time.sleep(0.05)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=60)
    assert not (tmp_path / "killed/final").exists()
    resumed = run(tmp_path / "killed", "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    a = load_file(str(tmp_path / "straight/final/model.safetensors"))
    b = load_file(str(tmp_path / "killed/final/model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)

    def steady(path):
        return [{k: v for k, v in json.loads(x).items() if "second" not in k} for x in
                (path / "metrics.jsonl").read_text().splitlines()]
    assert steady(tmp_path / "killed") == steady(tmp_path / "straight")
    assert any(r["replayed_groups"] for r in steady(tmp_path / "straight"))  # the resumed steps replayed too
    assert json.loads((tmp_path / "straight/checkpoints/step_4/selection.json").read_text()) == json.loads(
        (tmp_path / "killed/checkpoints/step_4/selection.json").read_text())
