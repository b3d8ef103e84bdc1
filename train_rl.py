"""
Reinforcement learning with verifiable rewards (RLVR) on math, in plain PyTorch: `python train_rl.py`.

The method, Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training"), as a diff from GRPO (Shao et al.
2024, DeepSeekMath, eq. 3): sample a group of G answers per problem, pay each 1 if the verifier accepts its final
answer, and push up the log-probs of answers better than their group's mean. Two lines change:
  1) A_i = r_i - mean(r): no division by the group's std, which up-weights problems that are almost always
     right or almost always wrong.
  2) Each answer's token terms are summed and divided by one constant (the generation budget), not by the
     answer's own length, which favours long wrong answers.
With one update per batch the PPO ratio is 1, so there is no clipping in effect and no KL: the gradient is
REINFORCE with the group mean as baseline. --objective picks another row of objectives.py (GRPO, DAPO, GSPO,
CISPO, RLOO, ...; `python objectives.py` lists them).

One step, in the order the code below runs it:
    draw P problems -> prompt text -> token ids -> sample G completions each with their log-probs (sample.py)
    -> grade them (verify.py) and pay them (reward.py) -> group advantages (objectives.py) -> loss over the
    completion tokens and an AdamW step (update.py) -> metrics, samples and checkpoints (runs.py).

    python train_rl.py --objective drgrpo --model tiny   # the embedded tiny world, CPU, 2 minutes
    python train_rl.py --objective drgrpo                # Qwen3-0.6B-Base, the first 50 Algebra problems of MATH
MATH-500 is held out: the training pool is checked against it; --eval-every evaluates on a validation split
carved from the training pool. Each option brings its flags in its own config and enters by a named call:
curriculum.py (problem selection, replay, dynamic sampling), looped.py (--loop), lora.py (--lora-rank),
distributed.py (torchrun, --fsdp), diversity.py (--dispersion-every). What research/ calls: train, rl_step,
policy_update, sft_update (the distillation step), sequence_tensors, rollout_tensors, micro_batches, lr_at, set_lr,
flag_defaults, Config.
"""

import copy
import dataclasses
import functools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

import checkpoint
import cli
import curriculum
import distributed as D
import evaluate
import guards
import looped
import lora
import memory
import model
import objectives
import problems
import reward
import runs
import verify
from curriculum import SelectionConfig
from distributed import DistributedConfig
from diversity import DiversityConfig, group_dispersion, group_diversity
from guards import GuardConfig
from looped import LoopConfig
from lora import LoraConfig
from memory import MemoryConfig
from model import flops_per_token, token_logprobs
from objectives import OBJECTIVES, ObjectiveConfig
from reward import RewardConfig
from sample import generate
from update import Example, sequence_tensors, sft_update  # noqa: F401 (research/ calls them as train_rl's)
from update import autocast, micro_batches, policy_update, rollout_tensors

data_arg, sampling_arg, optim_arg, run_arg, speed_arg = map(cli.arg_group, (
    "model and data", "sampling", "optimization", "run", "speed and memory"))


@dataclass
class SpeedConfig:
    """train_rl.py's speed and memory switches (train_rl.Config inherits them): none changes what is computed,
    except the micro-batch size, which moves float summation order."""
    compile: bool = speed_arg(False, "the sampler's static decode step in a CUDA graph (slower on a CPU)")
    micro_batch_tokens: int = speed_arg(4096, "padded tokens per forward/backward micro-batch (gradient "
                                              "accumulation)", range="[1, inf)")
    skip_zero_advantage: bool = speed_arg(True, "leave rows with zero advantage out of the backward (same gradient)")
    grad_checkpointing: bool = speed_arg(False, "recompute activations in backward to save memory")
    kernels: bool = speed_arg(False, "model.py's formulas through model_kernels.py's hand-written kernels: the same "
                                     "math in fewer ops, the log-probs' logits never whole (README: when it pays)")


@dataclass
class Config(RewardConfig, ObjectiveConfig, SelectionConfig, SpeedConfig, LoopConfig, LoraConfig, DistributedConfig,
             DiversityConfig, MemoryConfig, GuardConfig):
    """Every setting of a run. Its own fields are what every run uses; each option brings its flags from its own
    module (reward.py, objectives.py, curriculum.py, looped.py, lora.py, distributed.py, diversity.py)."""
    HELP_GROUPS = ("model and data", "sampling", "optimization", "run", "reward", "objective",
                   "problem selection and replay", "speed and memory", "looped depth", "LoRA", "several GPUs",
                   "diversity")  # the order --help shows them in: the plain run first
    model: str = data_arg(checkpoint.DEFAULT_MODEL, "Hugging Face repo id, local checkpoint directory, tiny or "
                                                    "tiny-ladder")
    dataset: str = data_arg("math_train", "training pool: a data set name (problems.py) or a .jsonl path")
    subject: str = data_arg("Algebra", "keep only problems of this subject ('' keeps all)")
    num_problems: int = data_arg(50, "train on the first N problems of the pool (0: all)", range="[0, inf)")
    val_dataset: str = data_arg("", "validation set for --eval-every ('': carved from the training pool)")
    val_size: int = data_arg(100, "validation problems carved from the pool when --val-dataset is not given",
                             range="[0, inf)")
    test_dataset: str = data_arg("", "evaluated before and after training, never used for a choice ('': none)")
    template: str = data_arg("base", "prompt template", choices=problems.TEMPLATES)
    steps: int = sampling_arg(50, "optimizer updates (one batch of rollouts each)", range="[1, inf)")
    problems_per_step: int = sampling_arg(1, "P: problems drawn per step", range="[1, inf)")
    group_size: int = sampling_arg(8, "G: completions sampled per problem", range="[1, inf)")
    max_new_tokens: int = sampling_arg(512, "generation budget per completion (also Dr. GRPO's loss constant)",
                                       range="[1, inf)")
    temperature: float = sampling_arg(1.0, "sampling temperature for rollouts", range="(0, inf)")
    top_p: float = sampling_arg(1.0, "nucleus sampling mass for rollouts, in (0, 1]", range="(0, 1]")
    lr: float = optim_arg(1e-5, "peak learning rate of AdamW", range="[0, inf)")
    weight_decay: float = optim_arg(0.0, "AdamW weight decay", range="[0, inf)")
    warmup_steps: int = optim_arg(0, "linear warmup steps", range="[0, inf)")
    schedule: str = optim_arg("constant", "after warmup: constant, or cosine / linear decay to 0",
                              choices=("constant", "cosine", "linear"))
    grad_clip: float = optim_arg(1.0, "max gradient norm (0: no clipping)", range="[0, inf)")
    seed: int = run_arg(0, "seed for data order, sampling and initialization", range="[0, 4294967295]")
    device: str = run_arg("", "cuda, cuda:N or cpu ('': cuda when available)")
    threads: int = run_arg(0, "torch CPU threads (0: one per core); on a machine another job keeps busy, 1 is faster "
                              "(benchmarks/bench_threads.py); the count moves float rounding, so a resume keeps it",
                           range="[0, inf)")
    out: str = run_arg("", "run directory ('': runs/<objective>-<model>)")
    resume: bool = run_arg(False, "continue the run in --out from its last checkpoint")
    save_every: int = run_arg(25, "checkpoint every N steps (0: only at the end)", range="[0, inf)")
    keep_checkpoints: int = run_arg(0, "keep only the newest N periodic checkpoints (0: keep all)", range="[0, inf)")
    eval_every: int = run_arg(0, "evaluate on the validation split every N steps (0: never)", range="[0, inf)")
    eval_max_new_tokens: int = run_arg(0, "generation budget for evaluation (0: --max-new-tokens)", range="[0, inf)")
    eval_group_by: str = run_arg("source", "also log validation accuracy per value of this problem field ('': no)")
    samples_per_step: int = run_arg(2, "completions per step written to samples.jsonl", range="[0, inf)")


# The embedded tiny world (--model tiny, tiny-ladder, or a model trained from them) brings its own defaults, and
# its ladder (--dataset tiny_ladder_train) its rungs, a budget that fits the top rung and the step-checking
# grader; flags given still win (`--model tiny --help` shows them).
# A run's settings, all of them: Config's fields above (with the option configs' it inherits), these two tables,
# and an objective's paper values for --clip-low, --clip-high and --dynamic-sampling (its row's `defaults` in
# objectives.OBJECTIVES, else 0.2, 0.2, off). The run directory's config.json holds them resolved.
TINY_DEFAULTS = dict(dataset="tiny_train", subject="", num_problems=0, val_dataset="tiny_val", test_dataset="tiny_test",
                     steps=60, problems_per_step=16, group_size=8, max_new_tokens=64, lr=1e-4, eval_every=20,
                     save_every=20, eval_group_by="level")
LADDER_DEFAULTS = dict(val_dataset="tiny_ladder_val", test_dataset="tiny_ladder_test", eval_group_by="level",
                       max_new_tokens=128, grader="steps")
# Settings that may change when a run is resumed; everything else must match the saved config.
RESUMABLE = {"steps", "resume", "save_every", "keep_checkpoints", "eval_every", "samples_per_step", "device", "out",
             "fsdp", "compile", "dispersion_every"} | {
                 f.name for c in (MemoryConfig, GuardConfig) for f in dataclasses.fields(c)}  # plan and guards: any


@dataclass
class Run:
    """What every step of a run uses, built once by train()."""
    cfg: Config
    policy: torch.nn.Module  # the fp32 model trained (with LoRA adapters, looped or sharded as the flags say)
    sampler: torch.nn.Module  # the copy that samples (distributed.sampling_copy): the policy itself on a CPU
    reference: torch.nn.Module | None  # the frozen initial policy, with --kl-coef > 0
    optimizer: torch.optim.Optimizer  # AdamW
    tokenizer: object  # checkpoint.load_tokenizer's
    train_set: list  # the training pool's problem rows
    device: str
    selection: dict  # the data state (curriculum.new_selection): 'pass_rates' and 'replay', each when on
    world: int = 1  # processes (torchrun): above 1, sampling and the update go through distributed.py


# -----------------------------------------------------------------------------
# One RL step, steps 1-7 in order; below it, the functions it calls, in the order it calls them


def rl_step(run, step, totals):
    """Problems -> rollouts -> rewards -> advantages -> loss -> AdamW step; returns (the rollouts drawn, the step's
    metrics with the compute totals so far). totals: the compute before this step (add_compute)."""
    cfg = run.cfg
    set_lr(run.optimizer, lr_at(step, cfg))
    # 1-4. P problems -> prompts -> G samples each -> graded, rewarded (the options: draw_rollouts)
    drawn, batch, replayed, tally = draw_rollouts(run, step)
    t0 = time.time()
    if run.reference is not None and cfg.kl_in == "reward":
        add_reference_kl(run, batch)
    # 5. advantages, per group of G, from the rewards and from what passed (the verdict, or a control's)
    rewards = torch.tensor([r.reward for r in batch], dtype=torch.float32).view(-1, cfg.group_size)  # (P, G)
    passed = torch.tensor([r.passed for r in batch], dtype=torch.bool).view(-1, cfg.group_size)  # (P, G)
    advantages = OBJECTIVES[cfg.objective].advantages(rewards, passed, cfg) if batch else rewards  # (P, G)
    for r, a in zip(batch, advantages.flatten().tolist()):
        r.advantage = a
    # 6. loss and AdamW step; a zero-advantage row adds nothing to the gradient unless a KL loss term needs it
    kl_in_loss = run.reference is not None and cfg.kl_in == "loss"
    trained = [r for r in batch if r.advantage != 0 or kl_in_loss or not cfg.skip_zero_advantage]
    batch_tokens = sum(len(r.tokens) for r in batch)  # the token-level losses' denominator
    stats = dict(loss=0.0, entropy=float("nan"), clip_fraction=0.0, kl=0.0, grad_norm=0.0, tokens=0, nonfinite=False)
    if trained:  # the denominators count the whole batch (P x G rows), dropped rows too: the same loss as without
        stats = policy_update(run, trained, len(batch), batch_tokens)
    if run.reference is not None and cfg.kl_in == "reward":
        stats["kl"] = sum(r.kl for r in batch) / max(1, batch_tokens)
    tally["training"] = time.time() - t0
    if cfg.dispersion_every and (step + 1) % cfg.dispersion_every == 0:
        stats["group_dispersion"] = group_dispersion(run.sampler, drawn, cfg.group_size)
    stats.update(skipped=stats["nonfinite"] or not trained, tally=tally, replayed=replayed)
    # 7. metrics
    totals = add_compute(totals, drawn, stats["tokens"], cfg, run.policy.config)
    return drawn, step_metrics(run, step, drawn, batch, stats, totals)


def lr_at(step, cfg):
    """Linear warmup, then constant / cosine / linear decay to zero; a function of the step alone (cfg: anything
    with lr, warmup_steps, steps and schedule)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    if cfg.schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * progress))
    if cfg.schedule == "linear":
        return cfg.lr * (1 - progress)
    return cfg.lr


def set_lr(optimizer, lr):
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # --loop-lr: the loop's group is scaled


# -----------------------------------------------------------------------------
# 1-4. Problems -> prompts -> G sampled completions each -> rewards (reward.py)


def draw_rollouts(run, step):
    """Steps 1-4 for one step: (every rollout drawn, the batch to learn from, groups given a replayed success, the
    tally: seconds spent sampling and verifying, checks with no verdict). Plainly one draw: the epoch's P problems,
    whose P groups of G are the batch. With an option of curriculum.py on, draw_with_options."""
    cfg, tally = run.cfg, dict(sampling=0.0, verifying=0.0, unverified=0)
    if run.selection or cfg.dynamic_sampling:
        return draw_with_options(run, step, tally)
    idx = problems_for_step(len(run.train_set), step, cfg.problems_per_step, cfg.seed)
    rollouts = sample_and_score(run, [run.train_set[i] for i in idx], sampling_seeds(cfg, step, 0, len(idx)), tally)
    return rollouts, list(rollouts), 0, tally


def problems_for_step(n_train, step, per_step, seed):
    """Indices drawn at `step`: a fresh seeded permutation each epoch, so the order is a function of step."""
    out = []
    for k in range(step * per_step, (step + 1) * per_step):
        epoch, i = divmod(k, n_train)
        perm = torch.randperm(n_train, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.append(int(perm[i]))
    return out


def sampling_seeds(cfg, step, draw, n):
    """One seed per problem of a draw, from (seed, step, draw, position): a group's samples do not depend on
    which other problems share its batch or on which process draws it."""
    return [(((cfg.seed * 1_000_003 + step) * 1_009 + draw) * 100_003 + k) % 2**32 for k in range(n)]


def sample_and_score(run, batch, seeds, tally):
    """Steps 2-4 for a list of problems, each with its own seed: Rollouts, sampled and graded. Adds to tally's
    sampling and verifying seconds, and its checks that ended with no verdict (verify.ERRORS)."""
    if run.world > 1:  # several processes: each samples and grades its share, all get every rollout (distributed.py)
        return D.shared_rollouts(lambda b, s: sample_and_score(dataclasses.replace(run, world=1), b, s, tally),
                                 batch, seeds, tally)
    t0, errors = time.time(), sum(verify.ERRORS.values())
    rollouts = collect_rollouts(run.sampler, run.tokenizer, batch, run.cfg, seeds)
    t1 = time.time()
    reward.score(rollouts, run.cfg)  # sets correct, boxed, passed and reward
    tally["sampling"] += t1 - t0
    tally["verifying"] += time.time() - t1
    tally["unverified"] += sum(verify.ERRORS.values()) - errors
    return rollouts


@dataclass
class Rollout:
    """One sampled completion of one problem, and what the step learns of it."""
    problem: dict  # the problem row (id, problem, answer, ...)
    prompt: list  # the prompt's token ids
    tokens: list  # the completion's token ids
    text: str  # the completion, decoded
    finish_reason: str  # "stop" (a stop token) or "length" (the budget ran out)
    sampler_logprobs: list  # per completion token, the log-prob the sampler drew it with
    seed: int  # the problem's sampling seed (sampling_seeds)
    sample: int  # its index in the group of G
    correct: bool = False  # the verifier's verdict (reward.score): the logged accuracy
    boxed: bool = False  # it has a final \boxed{} answer
    passed: bool = False  # what the learner counts as a success: the verdict, or --reward random / format's
    reward: float = 0.0  # the reward table's sum (reward.py)
    advantage: float = 0.0  # the objective's, from its group's rewards (step 5)
    kl: float = 0.0  # --kl-in reward: its KL estimate to the reference, summed over its tokens
    replayed: bool = False  # a past success put in by replay (curriculum.ReplayBuffer)
    behavior_logprobs: list | None = None  # the policy that drew it, when not this update's (old_logprobs)


def collect_rollouts(sampler, tokenizer, batch, cfg, seeds):
    """Sample G completions per problem (problem k with seeds[k]): Rollouts, problem-major."""
    prompts = [tokenizer.encode(problems.format_prompt(p["problem"], cfg.template)) for p in batch]
    completions = generate(sampler, prompts, cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                           n=cfg.group_size, stop_token_ids=tokenizer.stop_token_ids(chat=cfg.template != "base"),
                           seed=seeds, pad_id=tokenizer.pad_id, compile=cfg.compile)
    return [Rollout(problem=batch[c.prompt_index], prompt=prompts[c.prompt_index], tokens=c.tokens,
                    text=tokenizer.decode(c.tokens), finish_reason=c.finish_reason, sampler_logprobs=c.logprobs,
                    seed=seeds[c.prompt_index], sample=j % cfg.group_size)
            for j, c in enumerate(completions)]


# -----------------------------------------------------------------------------
# 7. Metrics and compute


def step_metrics(run, step, drawn, batch, stats, totals):
    """One line of metrics.jsonl: rewards, accuracy, lengths, diversity, the update's statistics, seconds and the
    compute totals so far. stats: policy_update's, with the step's tally (draw_rollouts') and replayed groups."""
    cfg, G, n = run.cfg, run.cfg.group_size, len(drawn)
    lengths = [len(r.tokens) for r in drawn]
    mixed = [len({r.reward for r in drawn[i:i + G]}) > 1 for i in range(0, n, G)]  # groups with a signal
    tally = stats["tally"]
    return dict(
        step=step + 1, reward_mean=sum(r.reward for r in drawn) / n, accuracy=sum(r.correct for r in drawn) / n,
        format_failure_rate=sum(not r.boxed for r in drawn) / n,
        direct_answer_rate=sum(is_direct_answer(r.text) for r in drawn) / n,
        response_tokens_mean=sum(lengths) / n, response_tokens_max=max(lengths),
        truncation_rate=sum(r.finish_reason == "length" for r in drawn) / n,
        mixed_groups=sum(mixed) / len(mixed), draws=n // (G * cfg.problems_per_step), batch_groups=len(batch) // G,
        **curriculum.selection_metrics(run.selection, stats["replayed"]), **group_diversity(drawn, G),
        **({"group_dispersion": stats["group_dispersion"]} if "group_dispersion" in stats else {}),
        entropy=stats["entropy"], clip_fraction=stats["clip_fraction"], **({"kl": stats["kl"]} if cfg.kl_coef else {}),
        loss=stats["loss"], grad_norm=stats["grad_norm"], lr=lr_at(step, cfg),
        skipped_update=stats["skipped"],
        sampling_seconds=tally["sampling"], verifying_seconds=tally["verifying"],
        training_seconds=tally["training"], tokens_per_second=sum(lengths) / max(tally["sampling"], 1e-9),
        verifier_errors=tally["unverified"], **looped.loop_metrics(run.policy), **totals,
        **({"peak_gpu_memory_gb": torch.cuda.max_memory_allocated() / 2**30} if torch.cuda.is_available() else {}))


def is_direct_answer(text):
    """The response opens with its boxed answer: no reasoning before it."""
    return text.lstrip().startswith("\\boxed")


def add_compute(totals, drawn, trained_tokens, cfg, config):
    """The running totals after a step: generated tokens, training tokens and FLOPs (model.flops_per_token at the
    step's mean context, each training token counted once per epoch)."""
    lengths = [len(r.tokens) for r in drawn]
    context = sum(len(r.prompt) for r in drawn) / len(drawn) + sum(lengths) / len(lengths) / 2
    return dict(generated_tokens=totals["generated_tokens"] + sum(lengths),
                training_tokens=totals["training_tokens"] + trained_tokens * cfg.epochs_per_batch,
                flops=totals["flops"] + (sum(lengths) * flops_per_token(config, context) + trained_tokens
                                         * cfg.epochs_per_batch * flops_per_token(config, context, training=True)))


# -----------------------------------------------------------------------------
# What only an option calls: curriculum.py's selection, replay and dynamic sampling; --kl-in reward


def draw_with_options(run, step, tally):
    """draw_rollouts with curriculum.py's options, each by name: the problem selector (choose_problems), replay
    puts a past success in some groups (curriculum.replay), dynamic sampling keeps only mixed groups and draws
    again, at most --max-draws times (curriculum.keep_mixed), and every fresh group updates the data state after
    the step's choices (curriculum.update_selection)."""
    G, P = run.cfg.group_size, run.cfg.problems_per_step
    drawn, fresh, batch_groups, replayed = [], [], [], 0
    for draw in range(curriculum.draws_per_step(run.cfg)):
        idx = choose_problems(run, step, draw, fresh)
        rollouts = sample_and_score(run, [run.train_set[i] for i in idx], sampling_seeds(run.cfg, step, draw, len(idx)),
                                    tally)
        drawn += rollouts
        groups = [rollouts[i:i + G] for i in range(0, len(rollouts), G)]
        fresh += [list(g) for g in groups]  # the samples as drawn, before replay changes the groups
        replayed += curriculum.replay(run.selection, groups, run.cfg)
        batch_groups += curriculum.keep_mixed(groups, run.cfg)[:P - len(batch_groups)]
        if len(batch_groups) == P:
            break
    curriculum.update_selection(run.selection, fresh, step)
    return drawn, [r for g in batch_groups for r in g], replayed, tally


def choose_problems(run, step, draw, fresh):
    """The problem selector: P indices for one draw of a step. Uniform by default: the epoch's permutation
    (problems_for_step), and on dynamic sampling's extra draws a permutation seeded by (seed, step, draw), so a
    resumed run draws the same. --select pass_rate: the pass-rate table's draw, leaving out the problems of the
    groups already drawn this step (fresh)."""
    cfg = run.cfg
    gen = torch.Generator().manual_seed((cfg.seed * 100_003 + step) * 1_009 + draw)  # a function of the step
    pass_rates = run.selection.get("pass_rates")
    if pass_rates is not None:
        return pass_rates.draw(cfg.problems_per_step, gen, exclude={pass_rates.index[g[0].problem["id"]] for g in fresh})
    if draw == 0:
        return problems_for_step(len(run.train_set), step, cfg.problems_per_step, cfg.seed)
    return torch.randperm(len(run.train_set), generator=gen)[:cfg.problems_per_step].tolist()


@torch.no_grad()
def reference_kl(run, rows):
    """r.kl = each rollout's KL estimate to the reference, summed over its tokens (on the sampler's samples)."""
    for rb in micro_batches(rows, run.cfg.micro_batch_tokens):
        ids, mask, sampler_logp = rollout_tensors(rb, run.tokenizer.pad_id, run.device)
        with autocast(run.device):
            ref_logp, _ = token_logprobs(run.reference, ids)
        kl = (objectives.kl_estimate(sampler_logp, ref_logp.float(), run.cfg.kl_estimator) * mask).sum(-1)
        for r, k in zip(rb, kl.tolist()):
            r.kl = k


def add_reference_kl(run, batch):
    """--kl-in reward: each rank scores its share (reference_kl), all get every value, and the reward table pays
    -beta times it (reward.add_kl; the per-sequence KL-in-reward of REINFORCE++ and InstructGPT)."""
    share = D.rank_share(batch)
    reference_kl(run, share)
    for r, kl in zip(batch, D.gather_lists([r.kl for r in share])):
        r.kl = kl
    reward.add_kl(batch, run.cfg)


# -----------------------------------------------------------------------------
# The run: check everything, claim --out, load the model, then step, evaluate and checkpoint


def evaluate_accuracy(sampler, tokenizer, problem_set, cfg, label):
    """Greedy accuracy by the one evaluation protocol, and per --eval-group-by value (evaluate.accuracy)."""
    return evaluate.accuracy(sampler, tokenizer, problem_set, cfg.eval_max_new_tokens or cfg.max_new_tokens,
                             cfg.template, cfg.eval_group_by or None, cfg.grader, cfg.compile, label)


def check_config(cfg):
    """Refuse settings that cannot run, naming the flag; nothing has been written yet. Each flag's own range and
    choices are declared on its field (cli.check_fields); here, the checks across flags."""
    cli.check_fields(cfg)
    objectives.check(cfg, cfg.group_size)
    reward.check(cfg)
    if cfg.fsdp and "WORLD_SIZE" not in os.environ:
        raise ValueError("--fsdp shards the model over torchrun's processes: start it with torchrun, e.g. "
                         "torchrun --nproc_per_node 8 train_rl.py --fsdp ...")
    if cfg.fsdp and cfg.lora_rank:
        raise ValueError("--fsdp with --lora-rank is not supported: the frozen base is replicated anyway; "
                         "run LoRA without --fsdp")
    if cfg.loop and (cfg.lora_rank or cfg.fsdp):
        raise ValueError("--loop with --lora-rank or --fsdp is not supported (--loop-lora-rank gives per-loop adapters)")
    if cfg.loop_lora_rank and not cfg.loop:
        raise ValueError(f"--loop-lora-rank {cfg.loop_lora_rank} needs --loop")
    looped.parse_loop(cfg.loop, None)  # the syntax now; the layer range once the model's config.json is read
    cli.check_device(cfg.device)


def train(cfg):
    """Run (or, with --resume, continue) the training described by cfg; returns the run directory."""
    check_config(cfg)
    device = D.setup_distributed(cfg.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    runs.set_threads(cfg.threads, device)
    model.use_kernels = cfg.kernels
    run_dir = Path(cfg.out or f"runs/{cfg.objective}-{Path(cfg.model).name}")
    runs.check_out(run_dir, "train", cfg.resume)
    if cfg.resume:
        runs.check_resume(run_dir / "config.json", dataclasses.asdict(cfg), RESUMABLE, Config)
        runs.check_steps_left(run_dir, cfg.steps)
    train_set, val_set, test_set = problems.load_pools(cfg)  # bad data or a missing model fail before anything is written
    model_dir = checkpoint.resolve_model_dir(cfg.model)
    model_config = checkpoint.read_config(model_dir)
    looped.parse_loop(cfg.loop, model_config.num_hidden_layers)
    tokenizer = checkpoint.load_tokenizer(cfg.model)
    longest, *_ = problems.check_prompts_fit(
        [(cfg.dataset, train_set), (cfg.val_dataset or "validation", val_set), (cfg.test_dataset, test_set)], tokenizer,
        cfg.template, max(cfg.max_new_tokens, cfg.eval_max_new_tokens), model_config.max_position_embeddings)
    memory.plan_training(cfg, model_config, longest, device)  # printed before loading; a run that cannot fit stops
    torch.manual_seed(cfg.seed)
    policy = checkpoint.load_model(cfg.model, dtype=torch.float32, device=device)  # fp32 master weights; bad weights
    policy = looped.add_loop(policy, cfg.loop, cfg.loop_lora_rank)  # fail here, still before anything is written
    D.barrier()  # every rank has read the run directory before rank 0 writes to it
    runs.claim(run_dir, "train", cfg.resume)  # held until this process ends
    if D.this_rank() == 0 and not cfg.resume:
        runs.write_json(run_dir / "config.json", dict(dataclasses.asdict(cfg), code_version=runs.code_version()))

    policy.gradient_checkpointing = cfg.grad_checkpointing
    reference = copy.deepcopy(policy).requires_grad_(False) if cfg.kl_coef else None
    ckpt = runs.readable_checkpoint(run_dir) if cfg.resume else None  # a damaged newest one: the one before it
    if ckpt is not None and not cfg.lora_rank:  # with LoRA the base stays frozen; adapters come from the trainer state
        policy.load_state_dict(checkpoint.load_model(ckpt, torch.float32, device).state_dict())
    if cfg.lora_rank:
        lora.add_lora(policy, cfg.lora_rank, cfg.lora_alpha)
    if cfg.fsdp:  # whole weights are loaded first; the optimizer then holds the shards
        D.shard_model(policy)
    optimizer = torch.optim.AdamW(looped.param_groups(policy, cfg.lr, cfg.loop_lr), lr=cfg.lr,
                                  weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    # from a step's first update until the loop counts it done, Ctrl-C and SIGTERM wait (so done names the weights)
    optimizer.register_step_pre_hook(lambda *_: runs.hold_interrupts())
    selection = curriculum.new_selection(cfg, train_set)
    start_step, pending = 0, None
    if ckpt is not None:
        start_step = runs.load_trainer_state(ckpt, policy, optimizer)
        runs.load_selection(ckpt, selection)
        pending = runs.unlogged(ckpt)  # interrupted after the update, before its step was logged: logged below
        print(f"resumed from {ckpt} after step {start_step}")
    sampler = D.sampling_copy(policy, device)
    logged, totals = runs.resume_logs(run_dir, start_step, pending)  # the last step in the logs; compute so far
    runs.print_config(cfg, run_dir, device, len(train_set), len(val_set),
                 sum(p.numel() for p in policy.parameters() if p.requires_grad))
    run = Run(cfg, policy, sampler, reference, optimizer, tokenizer, train_set, device, selection, D.world_size())

    eval_seconds = 0.0
    if test_set and start_step == 0:  # the held-out test split, before and after training: never used for a choice
        t0 = time.time()
        acc, _ = evaluate_accuracy(sampler, tokenizer, test_set, cfg, f"test ({cfg.test_dataset}) before training")
        eval_seconds = (time.time() - t0) * len(val_set) / len(test_set)  # a validation pass, estimated
        runs.append_jsonl(run_dir / "metrics.jsonl", dict(step=0, test_accuracy=acc))
        print(f"test accuracy before training ({cfg.test_dataset}): {acc:.3f}")
    validate = functools.partial(evaluate_accuracy, sampler, tokenizer, val_set, cfg) if val_set else None
    # done: updates in the weights (logged: in the logs; saved: in checkpoints/); before: the data state before a step
    t_start, step, done, saved, before = time.time(), start_step, start_step, start_step, None
    logged_steps = [m for m in runs.read_log(run_dir / "metrics.jsonl") if "truncation_rate" in m] if cfg.resume else []
    watch = guards.Guards(cfg, logged_steps)  # warns when a run goes bad; --guard-stop stops it as Ctrl-C does
    try:
        if pending:  # the step the checkpoint holds, logged as the straight run logs it
            eval_seconds = runs.log_step(run_dir, pending, validate, cfg.eval_every) or eval_seconds
            watch.watch(pending["metrics"])
        for step in range(start_step, cfg.steps):
            before = runs.selection_state(selection) if selection else None  # put back if this step is cut short
            drawn, metrics = rl_step(run, step, totals)
            pending = dict(metrics=metrics, samples=runs.sample_rows(drawn[:cfg.samples_per_step], step + 1))
            totals = {k: metrics[k] for k in totals}
            done = step + 1  # the step is in the weights and the data state; its lines are pending
            runs.release_interrupts()  # a Ctrl-C held since the update is raised here, with done counting it
            runs.check_finite_weights(policy, done)
            D.refresh_sampling_copy(sampler, policy)
            eval_seconds = runs.log_step(run_dir, pending, validate, cfg.eval_every) or eval_seconds
            logged = done
            runs.print_progress(metrics, cfg, time.time() - t_start, done - start_step, eval_seconds)
            watch.watch(metrics)
            if cfg.save_every and done % cfg.save_every == 0 and done < cfg.steps:
                runs.save_checkpoint(run_dir / "checkpoints" / f"step_{done}", policy, optimizer, tokenizer, done, cfg,
                                     selection)
                saved = done
                runs.keep_last_checkpoints(run_dir, cfg.keep_checkpoints)
        if saved < cfg.steps:  # (a resumed finished run has it already)
            runs.save_checkpoint(run_dir / "checkpoints" / f"step_{cfg.steps}", policy, optimizer, tokenizer, cfg.steps,
                                 cfg, selection)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: save what is done; exit status 130 or 143 (cli.run_main)
        runs.hold_interrupts()  # a second Ctrl-C must not cut the save in two; the exit status stays the first's
        if done == step and before is not None:
            runs.load_selection_state(selection, before)  # the step in progress is redone from its start
        if done > saved and not cfg.fsdp:  # FSDP: gathering shards needs every rank, which an interrupt does not give
            runs.save_checkpoint(run_dir / "checkpoints" / f"step_{done}", policy, optimizer, tokenizer, done, cfg,
                                 selection, unlogged=pending if logged < done else None)
        print(f"\ninterrupted: --resume continues from the last periodic checkpoint in {run_dir}" if cfg.fsdp else
              f"\ninterrupted: checkpoint after step {done} in {run_dir}; rerun with --resume to continue")
        runs.release(run_dir)
        raise
    finally:
        runs.release_interrupts(raise_held=False)
    runs.write_final(run_dir, cfg.steps)
    runs.keep_last_checkpoints(run_dir, cfg.keep_checkpoints)
    if test_set:
        acc, _ = evaluate_accuracy(sampler, tokenizer, test_set, cfg, f"test ({cfg.test_dataset}) after training")
        runs.append_jsonl(run_dir / "metrics.jsonl", dict(step=cfg.steps, test_accuracy=acc))
        print(f"test accuracy after training ({cfg.test_dataset}): {acc:.3f}")
    print(f"done: {run_dir}")
    runs.release(run_dir)
    return run_dir


# -----------------------------------------------------------------------------
# Command line: flags generated from Config (cli.py); --model tiny and the ladder bring their defaults


def flag_defaults(first):
    """Defaults that depend on other flags: the tiny world's (--model tiny or a model trained from it) and its
    ladder's (--dataset tiny_ladder_train, or any tiny_ladder pool); flags given still win. (An objective's paper defaults are
    ObjectiveConfig's own, so Python gets them too.)"""
    out = dict(TINY_DEFAULTS) if checkpoint.is_tiny_world(first.model) else {}
    out.update(LADDER_DEFAULTS if Path(first.dataset).stem.startswith("tiny_ladder") else {})
    return out


EPILOG = cli.world_epilog(TINY_DEFAULTS, LADDER_DEFAULTS, "The objectives: python objectives.py.")


def parse_args(argv=None):
    return cli.parse_config(Config, argv, __doc__.strip().split("\n\n")[0], defaults=flag_defaults, epilog=EPILOG,
                            prog="train_rl.py")


def main(argv=None):
    try:
        return train(parse_args(argv))
    finally:
        D.shutdown()


if __name__ == "__main__":
    cli.run_main(main, "train_rl.py")
