"""train_rl.py over several processes, as torchrun runs it: 2 gloo processes on the CPU against one process.

The same global batch and seeds must give the single process's weights (within 1e-6) and metrics, a resumed
2-process run must continue exactly, and --fsdp (FSDP2 shards) must give the same again. All 2-process runs
share one spawn of 2 workers (starting Python and torch twice is most of the cost)."""

import json
import os
import socket
import sys
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import distributed as D
import model as M
import train_rl as T
import checkpoint
import verify


def fake_grade(texts, refs):
    """A stand-in reward that gives groups of mixed correctness on a random model (real grading is tested in
    test_verify.py); set in every process, since monkeypatches do not cross process boundaries."""
    return [bool(t) and t[-1] < "n" for t in texts]


def use_fake_grader():
    T.verify.grade_batch = fake_grade


# P = 3 problems over 2 ranks (1 and 2 each) and G = 3: odd numbers of training rows split unevenly, and one
# row per micro-batch (each row is longer than micro_batch_tokens), so ranks run different numbers of passes.
# lr 1e-3: Adam's first step is about lr x sign(gradient), so where a gradient entry is ~0 its rounding
# (relative 5e-8 here) moves the weight by up to ~lr x 2e-4; at lr 1e-2 that is 2e-6, at 1e-3 within 1e-6.
BASE = dict(subject="", num_problems=0, val_size=0, steps=2, problems_per_step=3, group_size=3, max_new_tokens=8,
            lr=1e-3, seed=0, device="cpu", save_every=1, micro_batch_tokens=100, samples_per_step=1)
# name: (settings, steps of a first run that is then resumed to BASE's 2 steps, or 0)
RUNS = dict(
    ddp=(dict(), 0),
    ddp_resumed=(dict(), 1),
    fsdp=(dict(fsdp=True), 0),
    fsdp_resumed=(dict(fsdp=True), 1),
    # global batch statistics (REINFORCE++'s batch std), the KL-in-reward forward by shares, dynamic sampling,
    # and validation by shares (5 problems: 2 + 3) with accuracy per source
    mixed=(dict(objective="reinforce_pp", kl_coef=0.1, kl_in="reward", dynamic_sampling=True, max_draws=2,
                eval_every=1), 0),
    # one problem for two ranks: rank 0 draws and trains nothing, yet joins every collective
    one_problem=(dict(fsdp=True, problems_per_step=1, seed=4), 0),
)
SINGLE = {"ddp": "ddp", "ddp_resumed": "ddp", "fsdp": "ddp", "fsdp_resumed": "ddp", "mixed": "mixed",
          "one_problem": "one_problem"}  # the single-process run each 2-process run must equal


def config(root, model_dir, pool, name, **kw):
    settings = dict(RUNS[name][0])
    if "WORLD_SIZE" not in os.environ:  # the single process: the same run, unsharded
        settings.pop("fsdp", None)
    return T.Config(**dict(BASE, model=str(model_dir), dataset=str(pool), out=str(root / name),
                           val_dataset=str(pool.with_name("val.jsonl")), **settings, **kw))


def worker(rank, world, port, root, model_dir, pool):
    """One torchrun-like rank: the variables torchrun sets, one gloo group, then every run of RUNS."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    use_fake_grader()
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for name, (_, first_steps) in RUNS.items():
            if first_steps:
                T.train(config(root, model_dir, pool, name, steps=first_steps))
            T.train(config(root, model_dir, pool, name, resume=bool(first_steps)))
    finally:
        dist.destroy_process_group()
    # Leave without interpreter finalization: gloo's C++ threads can abort the process while it tears down
    # (SIGABRT, "terminate called without an active exception"; pytorch/pytorch#179291), after every run is saved.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{name: (2-process run dir, 1-process run dir of the same settings)} for every run of RUNS."""
    from conftest import make_char_model
    root = tmp_path_factory.mktemp("distributed")
    model_dir = make_char_model(root / "char")
    pool, val = root / "pool.jsonl", root / "val.jsonl"
    pool.write_text("".join(json.dumps(dict(id=f"p{i}", problem=f"What is {i} + {i}?", answer=str(2 * i))) + "\n"
                            for i in range(7)))
    val.write_text("".join(json.dumps(dict(id=f"v{i}", source="ab"[i % 2], problem=f"What is {i}?", answer=str(i)))
                           + "\n" for i in range(5)))
    two, one = root / "two", root / "one"
    context = mp.start_processes(worker, args=(2, free_port(), two, model_dir, pool), nprocs=2, join=False,
                                 start_method="spawn")
    with pytest.MonkeyPatch.context() as mpatch:  # the single-process runs, while the workers run
        mpatch.setattr(T.verify, "grade_batch", fake_grade)
        for name in set(SINGLE.values()):
            T.train(config(one, model_dir, pool, name))
    deadline = time.time() + 300
    while not context.join(timeout=1):  # a collective that waits forever must fail the test, not hang it
        if time.time() > deadline:
            for p in context.processes:
                p.kill()
            pytest.fail("the 2-process runs did not finish in 300 s")
    return {name: (two / name, one / SINGLE[name]) for name in RUNS}


def weights(run):
    return checkpoint.load_model(run / "final", device="cpu").state_dict()


def max_difference(a, b):
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    return max((wa[k] - wb[k]).abs().max().item() for k in wa)


def metrics(run):
    """Per-step metrics without the wall-clock fields."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "second" not in k} for r in rows]


# Sums over a different split of the batch (micro-batches per rank, then ranks) round differently in the last
# bits; everything drawn, graded or counted is equal exactly.
ROUNDED = {"loss", "entropy", "grad_norm", "kl"}


def assert_same_metrics(a, b, totals=True):
    ma, mb = metrics(a), metrics(b)
    assert [m["step"] for m in ma] == [m["step"] for m in mb] == [1, 2]
    for ra, rb in zip(ma, mb):
        assert ra.keys() == rb.keys()
        for k in ra:
            if k in ROUNDED:
                assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-7, nan_ok=True), k
            elif totals or k not in ("generated_tokens", "training_tokens", "flops"):
                assert ra[k] == rb[k], k


def first_moment_error(a, b):
    """After step 1 Adam's first moment is 0.1 x the step's gradient: the relative difference of two runs'."""
    from safetensors.torch import load_file
    ma, mb = (load_file(str(run / "checkpoints" / "step_1" / "trainer_state.safetensors")) for run in (a, b))
    assert ma.keys() == mb.keys()  # (no state at all when step 1 had no group of mixed rewards)
    keys = [k for k in ma if k.endswith(".exp_avg")]
    if not keys:
        return 0.0
    return (sum(((ma[k] - mb[k]) ** 2).sum() for k in keys) / sum((mb[k] ** 2).sum() for k in keys)).sqrt().item()


@pytest.mark.parametrize("name", ["ddp", "fsdp", "mixed", "one_problem"])
def test_two_processes_give_the_single_process_result(runs, name):
    two, one = runs[name]
    assert first_moment_error(two, one) < 1e-6  # the summed gradient is the single process's, up to rounding
    assert max_difference(two, one) < 1e-6
    assert_same_metrics(two, one)
    assert [json.loads(line)["step"] for line in (two / "samples.jsonl").read_text().splitlines()] == [1, 2]
    if name == "one_problem":  # (seed 4: both steps have a group of mixed rewards, so an update)
        assert all(m["grad_norm"] > 0 for m in metrics(two))
    if name == "mixed":  # validation by shares, gathered: the same accuracy overall and per source
        assert all(set(m["val_accuracy_by_group"]) == {"a", "b"} for m in metrics(two))


def test_ranks_ran_different_numbers_of_passes(runs):
    # an odd number of training rows (G = 3 times an odd number of mixed groups) splits unevenly over the
    # ranks (3 rows: 1 + 2), one row per pass: the manual all-reduce and FSDP's padding passes both ran
    mixed_groups = [round(m["mixed_groups"] * 3) for m in metrics(runs["ddp"][0])]
    assert any(n % 2 == 1 for n in mixed_groups), mixed_groups


@pytest.mark.parametrize("name", ["ddp_resumed", "fsdp_resumed"])
def test_resumed_two_process_run_continues_exactly(runs, name):
    resumed, straight = runs[name][0], runs[name.split("_")[0]][0]
    assert max_difference(resumed, straight) == 0.0
    assert_same_metrics(resumed, straight, totals=False)  # run totals restart with the resumed processes


def test_fsdp_checkpoint_files_are_the_plain_ones(runs):
    """--fsdp writes the same files as replicated training: Hugging Face weights, and the optimizer state
    numbered as a plain optimizer numbers its parameters."""
    from safetensors.torch import load_file
    plain, sharded = (runs[name][0] / "checkpoints" / "step_2" for name in ("ddp", "fsdp"))
    a, b = load_file(str(plain / "trainer_state.safetensors")), load_file(str(sharded / "trainer_state.safetensors"))
    assert a.keys() == b.keys()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert (json.loads((plain / "trainer_state.json").read_text())["param_groups"]
            == json.loads((sharded / "trainer_state.json").read_text())["param_groups"])
    assert (plain / "model.safetensors").exists() and (sharded / "model.safetensors").exists()


def test_rank_share_hand_written():
    assert [D.rank_share(list(range(10)), r, 3) for r in range(3)] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert [D.rank_share(list(range(3)), r, 2) for r in range(2)] == [[0], [1, 2]]
    assert [D.rank_share(["a"], r, 2) for r in range(2)] == [[], ["a"]]  # fewer items than ranks
    assert D.rank_share([1, 2, 3]) == [1, 2, 3]  # one process: everything
    problems, seeds = [f"p{i}" for i in range(8)], list(range(100, 108))
    for r in range(4):  # a rank takes whole problems together with their own seeds
        assert D.rank_share(problems, r, 4) == [f"p{i}" for i in (2 * r, 2 * r + 1)]
        assert D.rank_share(seeds, r, 4) == [100 + 2 * r, 101 + 2 * r]


def test_fsdp_needs_torchrun_and_full_fine_tuning(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match="torchrun"):
        T.check_config(T.Config(fsdp=True))
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="--fsdp with --lora-rank"):
        T.check_config(T.Config(fsdp=True, lora_rank=4))
    assert T.parse_args(["--fsdp"]).fsdp and not T.parse_args([]).fsdp
