"""--loop START:END:N in train_rl.py and evaluate.py (looped depth, model.py): a looped run trains its gates at
--loop-lr, logs layer passes, FLOPs and gates, saves a looped checkpoint that resumes exactly, and bad values end
with one clear line. The model-level properties (exactness at initialisation, cache, FLOPs, checkpoint format)
are in test_model.py and test_sample.py."""

import json
import subprocess
import sys

import pytest
import torch

import evaluate as E
import model as M
import train_rl as T
from test_train_rl import run_setup  # noqa: F401 (a fixture)


@pytest.mark.parametrize("rank", [0, 2])
def test_a_looped_run_trains_its_gates_at_loop_lr_and_saves_a_looped_checkpoint(run_setup, rank):  # noqa: F811
    run = T.train(run_setup(steps=2, lr=1e-3, loop="1:2:3", loop_lr=0.05, loop_lora_rank=rank, save_every=1))
    m = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    looped = M.load_model(run / "final", device="cpu")
    c = looped.config
    assert (c.loop_start, c.loop_end, c.loop_count, c.loop_lora_rank) == (1, 2, 3, rank)
    assert [r["layer_passes"] for r in m] == [4, 4]  # 2 layers + 2 extra passes of layer 1
    assert m[0]["loop_parameters"] == M.loop_parameters(c) == 2 * 2 * 32 + 2 * M.loop_lora_weights(c)
    assert all(a > 0 for a in m[-1]["loop_gate_abs"])
    assert m[-1]["loop_gate_abs"] == M.loop_metrics(looped)["loop_gate_abs"]
    # Adam moves a parameter by about lr a step: the gates at --loop-lr, not at --lr
    assert 0.01 < max(m[-1]["loop_gate_abs"]) <= 2 * 0.05 + 1e-6
    meta = json.loads((run / "checkpoints" / "step_1" / "trainer_state.json").read_text())
    assert [(g["lr"], g["weight_decay"]) for g in meta["param_groups"]][1] == (0.05, 0.0)
    assert (run / "final" / "loop.safetensors").is_file()
    transformers = pytest.importorskip("transformers")
    with pytest.raises(ValueError, match="looped_qwen3"):
        transformers.AutoModelForCausalLM.from_pretrained(run / "final")


def test_a_looped_run_resumes_exactly(run_setup, tmp_path):  # noqa: F811
    flags = dict(loop="0:2:2", loop_lr=0.05, save_every=1)
    straight = T.train(run_setup(steps=2, out=str(tmp_path / "straight"), **flags))
    T.train(run_setup(steps=1, out=str(tmp_path / "split"), **flags))
    split = T.train(run_setup(steps=2, out=str(tmp_path / "split"), resume=True, **flags))
    a, b = (M.load_model(run / "final", device="cpu").state_dict() for run in (straight, split))
    assert a.keys() == b.keys() and "loop.gate" in a
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("flags,message", [
    (["--loop", "3:1:2"], "--loop 3:1:2: END must be > START"),
    (["--loop", "0:5:2"], "--loop 0:5:2: the looped layers .* 2 layers"),
    (["--loop", "0:2:0"], "--loop 0:2:0: N must be >= 1"),
    (["--loop", "0-2-2"], "--loop 0-2-2: expected START:END:N"),
    (["--loop-lora-rank", "2"], "--loop-lora-rank 2 needs --loop"),
    (["--loop", "0:2:2", "--lora-rank", "4"], "--loop with --lora-rank"),
])
def test_bad_loop_flags_end_with_one_line_before_anything_is_written(char_model_dir, tmp_path, flags, message):
    out = tmp_path / "run"
    argv = ["--model", str(char_model_dir), "--dataset", "tiny_train", "--subject", "", "--out", str(out),
            "--device", "cpu", *flags]
    with pytest.raises(ValueError, match=message):
        T.train(T.parse_args(argv))
    assert not out.exists()
    if flags[1] in ("3:1:2", "0:5:2"):  # the scripts print it as one line: caught early, or once the model is read
        for script, more in (("train_rl.py", argv[2:]), ("evaluate.py", ["--dataset", "tiny_test", "--out", str(out)])):
            r = subprocess.run([sys.executable, str(M.REPO_DIR / script), *argv[:2], *more, *flags],
                               capture_output=True, text=True, cwd=tmp_path)
            last = r.stderr.strip().splitlines()[-1]
            assert r.returncode == 2 and last.startswith(f"{script}: error: --loop"), r.stderr
        assert not out.exists()


def test_evaluate_with_loop_gives_the_plain_answers_at_more_flops(char_model_dir, tmp_path):
    argv = ["--model", str(char_model_dir), "--dataset", "tiny_test", "--limit", "6", "--max-new-tokens", "12",
            "--device", "cpu"]
    plain = E.main(argv + ["--out", str(tmp_path / "plain")])
    looped = E.main(argv + ["--out", str(tmp_path / "looped"), "--loop", "0:2:3"])
    read = lambda d: [json.loads(x) for x in (tmp_path / d / "records.jsonl").read_text().splitlines()]  # noqa: E731
    assert [r["response"] for r in read("looped")] == [r["response"] for r in read("plain")]
    assert (plain["layer_passes"], looped["layer_passes"]) == (2, 6)
    assert looped["settings"]["loop"] == "0:2:3" and plain["settings"]["loop"] == ""
    assert 2.5 < looped["inference_flops"] / plain["inference_flops"] < 3
    with pytest.raises(ValueError, match="loop: '' there, '0:2:3' now"):  # one directory, one protocol
        E.main(argv + ["--out", str(tmp_path / "plain"), "--loop", "0:2:3"])


def test_a_looped_checkpoint_goes_through_rounds_and_stays_looped(tmp_path):
    """rounds.py (deliberate, distil, RL phase, evaluate) on a looped pi_0: every round's policy keeps the loop."""
    import rounds
    m = M.load_model("tiny", device="cpu")
    M.add_loop(m, "1:3:2")
    with torch.no_grad():
        m.loop.gate.fill_(0.05)
    M.save_model(m, tmp_path / "looped", M.load_tokenizer("tiny"))
    rows = rounds.main(["--model", str(tmp_path / "looped"), "--dataset", "tiny_ladder_train", "--rounds", "1",
                        "--num-problems", "8", "--samples", "2", "--val-limit", "6", "--eval-samples", "2",
                        "--test-dataset", "", "--rl-steps", "1", "--rl-problems-per-step", "2", "--rl-group-size", "2",
                        "--device", "cpu", "--out", str(tmp_path / "rounds")])
    assert [r["round"] for r in rows] == [0, 1]
    for r in (0, 1):
        policy = M.load_model(tmp_path / "rounds" / f"round_{r}", device="cpu")
        assert M.loop_spec(policy.config) == "1:3:2" and policy.loop.gate.abs().max() > 0
