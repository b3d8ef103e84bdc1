"""
The climb (issue #57): System 2 labels one new rung a round, System 1 learns it at a scale that works.

    python research/rounds/climb.py --out runs/climb/s0                          # rungs 6 -> 10 from tiny-ladder
    python research/rounds/climb.py --start runs/r49/hold-s0/round_10 --out runs/climb/hold-s0   # another start
    python research/rounds/climb.py --test --out runs/climb/s0                   # once, on the test splits

Round r (1, 2, ...) targets rung k = --start-rung + r - 1 (6, 7, 8, 9, 10 by default), from pi_{r-1} (pi_0 =
--start, saved as round_0/):
1. Label (System 2): pi_{r-1} solves --label-problems fresh training problems of rung k (the rung's rows of the
   split that holds it, in order, or with --problem-order seeded in an order shuffled by --seed; never a problem an
   earlier round labelled) by rounds.py's decomposed deliberation:
   each of --samples samples is a chain of calls on pieces of at most --chunk-ops operations. The traces the label
   source accepts are kept (rounds.select_traces: at most --max-traces a problem), written to traces_r.jsonl:
   --label-source key those verify.check_steps accepts against the training answer (the step key: only the
   reference chain passes, an upper bound), answer those whose boxed answer is the problem's (the real task's
   verifier), vote those whose boxed answer is the samples' plurality, given by at least --vote-min of them and
   tied by no other answer (no answer used). The row records what each source would keep and its precision by the
   step key and by the answer (rounds.label_precision), measured offline whichever source filtered.
2. Distil (System 1), when labelling gave at least --min-traces traces: the new rung's traces beside a replay of
   --replay-ratio as many earlier traces (every earlier round's, and with --base-replay those of the rungs below
   --start-rung: --base-labels ladder the ladder's worked solutions, an answer key; own pi_0's decomposed samples of
   --base-problems a rung, kept by --label-source in round 0), shared out as evenly over the earlier rungs as they
   allow; --updates AdamW steps of --batch-size traces drawn in seeded passes over the mix, lr warmed up linearly
   for --warmup updates then cosine-decayed from --lr (train_rl.lr_at), each step train_rl.sft_update (the
   token-mean NLL, prompt masked). A fresh optimizer every round (Lee et al. 2025 re-warm each round).
3. Evaluate pi_r: fast (greedy, step-valid, --max-new-tokens) per rung 2-10 (to the last rung labelled, when a run
   goes past rung 10: rungs 11-20 need --max-new-tokens 272) on the validation splits (--val-limit a rung), and the
   decomposed vote (majority over --samples) at the next rung, k + 1, up to the top one.
Row 0 of climb.jsonl evaluates pi_0 (its vote at --start-rung); row r holds round r: the rung, problems labelled
and solved, traces per rung in the mix, each rung's share of the mix's tokens and (--loss-probe) of its loss before
the first and after the last update, updates, FLOPs of labelling and of distillation (model.flops_per_token, as
rounds.py counts them), per-rung fast accuracy and the vote. --resume: a round is complete once its row is in
climb.jsonl; an incomplete round is redone (its labelling records, written by a policy already on disk, are
reused), so the result equals an uninterrupted run.

The controls and the baseline change one step: --labels generator labels every problem with the generator's own
worked chain (what perfect labels give, at no deliberation cost); --learner drgrpo skips labelling and runs
--rl-steps of Dr. GRPO (train_rl.train) on the round's problems beside --replay-ratio as many earlier-rung
problems, the first --dense-steps paying reward.prefix_credit; --learner scaffold is Dr. GRPO with the scaffold
(issue #67): the same labelling, then in place of imitation --updates Dr. GRPO steps on System 2's samples after
System 1's prompt, each rewarded by --label-source (groups it splits, beside as many replayed earlier groups).
--test evaluates every complete round's checkpoint once on the test splits (test.jsonl; research/rounds/climb_table.py
makes the tables).
"""

import collections
import contextlib
import dataclasses
import io
import json
import random
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the core, and research.*
import checkpoint  # noqa: E402
import cli  # noqa: E402
import evaluate as E  # noqa: E402
import model as M  # noqa: E402
import problems as P  # noqa: E402
import runs  # noqa: E402
import tiny  # noqa: E402
import train_rl as T  # noqa: E402
import update as U  # noqa: E402
import verify as V  # noqa: E402
from objectives import OBJECTIVE_FLAGS, OBJECTIVES  # noqa: E402
from research.rounds import rounds as R  # noqa: E402

# The splits that hold each rung: (top rung, training, validation, test split), rungs 2-6, 7-8, 9-10, 11-20.
SPLITS = ((6, "tiny_ladder_train", "tiny_ladder_val", "tiny_ladder_test"),
          (8, "tiny_ladder_far_train", "tiny_ladder_far_val", "tiny_ladder_far_test"),
          (10, "tiny_ladder_far2_train", "tiny_ladder_far2_val", "tiny_ladder_far2_test"),
          (20, "tiny_ladder_far3_train", "tiny_ladder_far3_val", "tiny_ladder_far3_test"))
FIRST_RUNG = 2
TOP_BEFORE_FAR3 = SPLITS[2][0]  # rung 10: the ladder's top before rungs 11-20; a run that stays below reads 2-10
TEMPLATE = "base"
# may change on --resume (and the --test flags); every other setting must match
TEST_FLAGS = ("test", "test_limit", "test_vote_limit", "reach_samples", "reach_limit")
RESUMABLE = {"rounds", "resume", "device", "out", *TEST_FLAGS}
PROGRAM = "climb"  # config.json's mark (runs.describe): a rounds.py run in --out is never resumed as a climb

label_arg, distil_arg, rl_arg, run_arg, test_arg = map(cli.arg_group, (
    "System 2: labelling a new rung", "System 1: distillation", "the baseline: Dr. GRPO rung by rung",
    "evaluation and run", "the test splits, once"))


@dataclass
class ClimbConfig:
    HELP_GROUPS = ("System 2: labelling a new rung", "System 1: distillation", "the baseline: Dr. GRPO rung by rung",
                   "evaluation and run", "the test splits, once")
    start: str = run_arg("tiny-ladder", "pi_0: tiny-ladder, tiny, or a checkpoint directory (e.g. a rounds run's "
                                        "round_N)")
    start_rung: int = label_arg(6, "the rung round 1 labels; round r labels start-rung + r - 1", range="[2, 10]")
    rounds: int = label_arg(5, "rounds, one new rung each (0: only evaluate --start)", range="[0, 19]")
    label_problems: int = label_arg(2000, "fresh training problems of the round's rung System 2 labels (fewer where "
                                          "the rung has fewer: 1,000 at rungs 7-8)", range="[1, inf)")
    samples: int = label_arg(8, "decomposed samples per problem, in labelling and in the vote", range="[1, inf)")
    labels: str = label_arg("decompose", "who labels the round's problems: decompose (System 2, pi_{r-1}'s decomposed "
                                        "samples) or generator (the control: the generator's own worked chain of "
                                        "every problem, what perfect labels give)", choices=("decompose", "generator"))
    label_source: str = label_arg("key", "which of System 2's decomposed samples label a problem: key (the step key, "
                                         "verify.check_steps against the training answer: the reference chain "
                                         "only, the upper bound), answer (the boxed answer equals the problem's, "
                                         "the real task's verifier) or vote (the boxed answer is the samples' "
                                         "plurality, --vote-min; no answer used). Every arm's row measures each "
                                         "source's precision offline", choices=R.LABEL_SOURCES)
    vote_min: int = label_arg(2, "--label-source vote: the fewest samples giving the plurality answer (a tie for the "
                                 "top labels nothing)", range="[1, inf)")
    problem_order: str = label_arg("file", "which fresh problems a round labels: file (the rung's rows in the split's "
                                           "order, the same for every seed) or seeded (in an order shuffled by --seed, "
                                           "so each seed draws its own problems)", choices=("file", "seeded"))
    chunk_ops: int = label_arg(2, "operations per piece of the decomposition (pieces of 3 solved 1 of 40 rung-6 "
                                  "problems from tiny-ladder, pieces of 2 275 of 400)", range="[1, inf)")
    merge_zero: bool = label_arg(False, "a piece whose call boxes 0 is posed again joined to the next one (rounds.py "
                                        "--merge-zero: the tiny world starts no problem at 0)")
    temperature: float = label_arg(0.5, "sampling temperature of the decomposed samples", range="(0, inf)")
    max_traces: int = label_arg(1, "verified traces kept per problem (distinct texts)", range="[1, inf)")
    min_traces: int = distil_arg(32, "a round with fewer new verified traces distils nothing (pi_r = pi_{r-1}): a "
                                     "few traces drawn hundreds of times break the policy", range="[1, inf)")
    replay_ratio: float = distil_arg(1.0, "replayed earlier traces per new trace in the mix (0: none)",
                                     range="[0, inf)")
    base_replay: bool = distil_arg(True, "the replay also holds labelled problems of the rungs below --start-rung "
                                         "(tiny_ladder_train), labelled by --base-labels")
    base_labels: str = distil_arg("ladder", "who labels the base replay: ladder (the generator's worked solution of "
                                            "every problem: the reference chain, an answer key) or own (pi_0's "
                                            "decomposed samples of --base-problems a rung, kept by --label-source, "
                                            "in round 0)", choices=("ladder", "own"))
    base_problems: int = distil_arg(400, "--base-labels own: problems a rung below --start-rung that pi_0 labels",
                                    range="[1, inf)")
    updates: int = distil_arg(220, "AdamW updates of distillation a round", range="[1, inf)")
    batch_size: int = distil_arg(32, "traces per update", range="[1, inf)")
    lr: float = distil_arg(1e-3, "peak learning rate (cosine-decayed to 0 after warmup)", range="[0, inf)")
    warmup: int = distil_arg(20, "linear warmup updates", range="[0, inf)")
    weight_decay: float = distil_arg(0.0, "AdamW weight decay", range="[0, inf)")
    grad_clip: float = distil_arg(1.0, "max gradient norm (0: no clipping)", range="[0, inf)")
    micro_batch_tokens: int = distil_arg(4096, "padded tokens per forward/backward micro-batch", range="[1, inf)")
    loss_probe: int = distil_arg(64, "traces per rung whose NLL gives each rung's share of the loss (0: off)",
                                 range="[0, inf)")
    learner: str = rl_arg("distil", "how pi_r learns the round's rung: distil (System 2's labels, the climb), drgrpo "
                                    "(the baseline: Dr. GRPO on the same fresh problems beside as many earlier-rung "
                                    "problems, --replay-ratio, from pi_{r-1}; no labelling) or scaffold (Dr. GRPO on "
                                    "System 2's decomposed samples: the same labelling, every sample rewarded by "
                                    "--label-source, the distillation's --updates, --batch-size and --lr)",
                          choices=("distil", "drgrpo", "scaffold"))
    scaffold_negatives: bool = rl_arg(True, "--learner scaffold: the rejected samples are pushed down (Dr. GRPO's "
                                            "r - mean); --no-scaffold-negatives sets their advantage to 0, only the "
                                            "accepted ones reinforced (Zhu et al. 2025's positive-sample "
                                            "reinforcement, with Dr. GRPO's weights)")
    rl_steps: int = rl_arg(700, "Dr. GRPO steps a round", range="[1, inf)")
    rl_lr: float = rl_arg(1e-4, "Dr. GRPO peak lr (warmup --warmup steps, then cosine decay)", range="[0, inf)")
    rl_problems_per_step: int = rl_arg(16, "Dr. GRPO problems per step", range="[1, inf)")
    rl_group_size: int = rl_arg(8, "Dr. GRPO samples per problem", range="[1, inf)")
    dense_steps: int = rl_arg(0, "the first N of --rl-steps pay --prefix-credit, the rest the binary reward (Sun et "
                                 "al. 2025's two phases; 0: binary only)", range="[0, inf)")
    prefix_credit: float = rl_arg(0.5, "the dense phase's reward.prefix_credit", range="[0, 1]")
    max_new_tokens: int = run_arg(tiny.FAR2_MAX_NEW_TOKENS, "token budget of a greedy answer and of each decomposed "
                                                            "call (a 10-operation chain fits; past rung 10, 272)",
                                  range="[1, inf)")
    val_limit: int = run_arg(0, "validation problems a rung (0: all 100)", range="[0, inf)")
    eval_batch_size: int = run_arg(64, "problems per generate call of the greedy evaluation", range="[1, inf)")
    seed: int = run_arg(0, "seed of the decomposed samples, the replay draw and the batch order",
                        range="[0, 4294967295]")
    threads: int = run_arg(1, "torch CPU threads (0: one per core); a resume keeps it", range="[0, inf)")
    device: str = run_arg("", "cuda or cpu (default: cuda when available)")
    out: str = run_arg("runs/climb", "run directory")
    resume: bool = run_arg(False, "continue the run in --out: complete rounds are kept, an incomplete one redone")
    test: bool = test_arg(False, "evaluate each complete round's checkpoint of the run in --out once on the test "
                                 "splits (its own settings; rounds already in test.jsonl are kept), then stop")
    test_limit: int = test_arg(0, "test problems a rung of the greedy evaluation (0: all 200)", range="[0, inf)")
    test_vote_limit: int = test_arg(50, "test problems a rung of the decomposed vote (greedy uses all 200)",
                                    range="[1, inf)")
    reach_samples: int = test_arg(64, "samples at T = 1 of the reach test at the round's rung and one above "
                                      "(step-valid pass@k)", range="[1, inf)")
    reach_limit: int = test_arg(50, "test problems a rung of the reach test (0: no reach test)", range="[0, inf)")


def check_config(cfg):
    cli.check_fields(cfg)
    if cfg.learner == "drgrpo":  # train_rl's own checks, now rather than after round 0 is written
        if cfg.dense_steps >= cfg.rl_steps:
            raise ValueError(f"--dense-steps {cfg.dense_steps} must be below --rl-steps {cfg.rl_steps}")
        try:
            T.check_config(rl_config(cfg, "pool.jsonl", "tiny_ladder_val", cfg.start, "rl", cfg.rl_steps, 0,
                                     cfg.prefix_credit))
        except ValueError as e:
            raise ValueError(f"the Dr. GRPO baseline: {R.rl_flags(str(e))}") from None
    if cfg.label_source != "key" and (cfg.labels == "generator" or cfg.learner == "drgrpo"):
        raise ValueError(f"--label-source {cfg.label_source} chooses among System 2's samples; --labels generator "
                         f"and --learner drgrpo have none (leave it at key)")
    if cfg.learner == "scaffold" and (cfg.labels == "generator" or cfg.base_replay and cfg.base_labels == "ladder"):
        raise ValueError("--learner scaffold rewards System 2's samples; --labels generator and --base-labels ladder "
                         "give single worked chains (use --base-labels own or --no-base-replay)")
    if not cfg.scaffold_negatives and cfg.learner != "scaffold":
        raise ValueError(f"--no-scaffold-negatives changes --learner scaffold's advantages; --learner {cfg.learner} "
                         f"has none (leave it on)")
    if cfg.base_labels == "own" and not cfg.base_replay:
        raise ValueError("--base-labels own labels the base replay; --no-base-replay has none (leave it at ladder)")
    if cfg.base_labels == "own" and (cfg.labels == "generator" or cfg.learner == "drgrpo"):
        raise ValueError("--base-labels own labels with System 2's samples; --labels generator and --learner drgrpo "
                         "have none (leave it at ladder)")
    if cfg.start_rung + cfg.rounds - 1 > SPLITS[-1][0]:
        raise ValueError(f"--start-rung {cfg.start_rung} --rounds {cfg.rounds} would label rung "
                         f"{cfg.start_rung + cfg.rounds - 1}; the ladder's top rung is {SPLITS[-1][0]}")
    if top_rung(cfg) > TOP_BEFORE_FAR3 and cfg.max_new_tokens < tiny.FAR3_MAX_NEW_TOKENS:
        raise ValueError(f"--max-new-tokens {cfg.max_new_tokens} cannot hold rung {top_rung(cfg)}'s chain; a run "
                         f"past rung {TOP_BEFORE_FAR3} needs --max-new-tokens {tiny.FAR3_MAX_NEW_TOKENS} "
                         f"(a 20-line chain)")
    cli.check_device(cfg.device)


def top_rung(cfg):
    """The highest rung a run evaluates: the last one it labels, at least 10 (a run that stays below rung 11 reads
    rungs 2-10, as before rungs 11-20 were added), so the vote at the next rung stops at the top one."""
    return max(TOP_BEFORE_FAR3, cfg.start_rung + cfg.rounds - 1)


def splits_for(cfg):
    """The SPLITS rows holding rungs 2 to top_rung."""
    return [s for i, s in enumerate(SPLITS) if i == 0 or SPLITS[i - 1][0] < top_rung(cfg)]


def rungs_for(cfg):
    return range(FIRST_RUNG, top_rung(cfg) + 1)


def rounds_view(cfg):
    """rounds.py's settings of its decomposed deliberation and trace selection, from the climb's."""
    return R.RoundsConfig(template=TEMPLATE, grader="steps", eval_group_by="level", deliberation="decompose",
                          chunk_ops=cfg.chunk_ops, merge_zero=cfg.merge_zero, samples=cfg.samples,
                          temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, selection="distinct",
                          max_traces=cfg.max_traces, seed=cfg.seed)


# -----------------------------------------------------------------------------
# 1. Label: fresh problems of the round's rung, solved by decomposition, kept where every line checks


def split_of(rung, which):
    """The split holding a rung: which = 1 training, 2 validation."""
    return next(s[which] for s in SPLITS if rung <= s[0])


def fresh_problems(pool, rung, n, used, seed=None):
    """The first n rows of the rung in pool (a split's rows, in order, or with a seed in an order shuffled by it)
    that no earlier round used."""
    rows = [p for p in pool if p["level"] == rung]
    if seed is not None:  # --problem-order seeded: each seed its own problems (issue #67)
        random.Random(f"climb-problems-{seed}-{rung}").shuffle(rows)
    return [p for p in rows if p["id"] not in used][:n]


def order_seed(cfg):
    """fresh_problems' seed: None in the split's order (--problem-order file), else --seed."""
    return cfg.seed if cfg.problem_order == "seeded" else None


def labels_dir(out, q):
    """Where round q's labelling records live: round_q/label/ (round 0: round_0/base_label/, pi_0's labels of the
    base replay, --base-labels own); its records.jsonl is the cache a resume reads."""
    return out / f"round_{q}" / ("base_label" if q == 0 else "label")


def write_labelled_ids(out, r, problems):
    """Round r's problems as id rows, where no System 2 records them (the generator labels, the Dr. GRPO
    baseline): used_ids reads them, so later rounds take fresh problems."""
    where = labels_dir(out, r)
    where.mkdir(parents=True, exist_ok=True)
    runs.write_jsonl(where / "records.jsonl", [dict(id=p["id"]) for p in problems])


def used_ids(out, r):
    """Problems labelled by rounds 1..r-1 (their labelling records on disk: evaluate's, or ids alone where no
    System 2 labelled them)."""
    paths = [labels_dir(out, q) / "records.jsonl" for q in range(1, r)]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"{missing[0]}: an earlier round's labelling records are missing")
    return {rec["id"] for p in paths for rec in runs.read_log(p)}


def worked_traces(rows, tokenizer, r, source):
    """The generator's worked chain of each row (verify.chain, the text a verified decomposed trace has) as trace
    rows (rounds.traces_for_round's fields): the ladder's base replay (round 0), or the generator-labels control."""
    out = []
    for p in rows:
        lines, value = V.chain(p["problem"])
        response = "\n" + "\n".join(lines + [f"\\boxed{{{value}}}"])
        n = len(tokenizer.encode(response))
        out.append(dict(round=r, id=p["id"], level=p["level"], prompt_tokens=len(tokenizer.encode(
            P.format_prompt(p["problem"], TEMPLATE))), completion_tokens=n, target_tokens=n + 1, adaptive=False,
            source=source, response=response))
    return out


def base_traces(cfg, out, train, tokenizer, device):
    """The replay's traces of the rungs below --start-rung, and row 0's fields about their labels: none
    (--no-base-replay), the generator's worked solution of every row (--base-labels ladder: the reference chain,
    an answer key), or pi_0's decomposed samples of --base-problems fresh rows a rung kept by --label-source
    (--base-labels own, round 0's System 2; its records in round_0/base_label are the cache a resume reads)."""
    if not cfg.base_replay:
        return [], {}
    rows = [p for p in train[SPLITS[0][1]] if p["level"] < cfg.start_rung]
    if cfg.base_labels == "ladder":
        return worked_traces(rows, tokenizer, 0, "ladder"), {}
    view = rounds_view(cfg)
    problems = [p for k in range(FIRST_RUNG, cfg.start_rung)
                for p in fresh_problems(rows, k, cfg.base_problems, set(), order_seed(cfg))]
    _, sampler = R.load_policy(out / "round_0", device)
    records, label = R.decompose(sampler, tokenizer, problems, view, labels_dir(out, 0),
                                 1_000 * (cfg.seed + 1), cfg.samples, SPLITS[0][1])
    traces = R.traces_for_round(records, view, 0, tokenizer, cfg.label_source, cfg.vote_min)
    return traces, dict(base_rungs=list(range(FIRST_RUNG, cfg.start_rung)), label_source=cfg.label_source,
                        base_problems_labelled=len(problems), base_traces=len(traces),
                        base_labels_by_source={k: R.label_precision(records, view.selection, view.max_traces, k,
                                                                    cfg.vote_min) for k in R.LABEL_SOURCES},
                        label_samples=label["samples_total"], deliberation_flops=label["inference_flops"] or 0.0)


# -----------------------------------------------------------------------------
# 2. Distil: the new rung beside a replay of the earlier ones


def replay_counts(available, total):
    """Traces to replay per earlier rung: `total` shared out as evenly as `available` ({rung: traces}) allows, the
    scarcest rungs served first and what they lack passed on to the others."""
    counts, left = {}, total
    order = sorted(available, key=lambda k: (available[k], k))
    for i, k in enumerate(order):
        counts[k] = min(available[k], -(-left // (len(order) - i)))
        left -= counts[k]
    return dict(sorted(counts.items()))


def replay(earlier, n_new, ratio, seed, r):
    """round(ratio x n_new) traces of earlier ({rung: traces}), per rung by replay_counts, drawn without replacement
    with a seed of (--seed, round, rung)."""
    counts = replay_counts({k: len(v) for k, v in earlier.items()}, round(ratio * n_new))
    return [t for k, n in counts.items() for t in random.Random(f"climb-{seed}-{r}-{k}").sample(earlier[k], n)]


def by_rung(traces):
    out = {}
    for t in traces:
        out.setdefault(int(t["level"]), []).append(t)
    return dict(sorted(out.items()))


def distil_config(cfg):
    """train_rl's Config of a round's distillation: its lr schedule (train_rl.lr_at) and optimization settings."""
    return T.Config(lr=cfg.lr, warmup_steps=cfg.warmup, schedule="cosine", steps=cfg.updates, grad_clip=cfg.grad_clip,
                    weight_decay=cfg.weight_decay, micro_batch_tokens=cfg.micro_batch_tokens)


def batches(n, size, cfg, r):
    """--updates batches of `size` indices of n rows, drawn in passes over them, each pass a permutation seeded by
    (--seed, round, pass)."""
    order, epoch = [], 0
    for _ in range(cfg.updates):
        while len(order) < size:
            gen = torch.Generator().manual_seed((cfg.seed * 1_009 + r) * 1_009 + epoch)
            order, epoch = order + torch.randperm(n, generator=gen).tolist(), epoch + 1
        batch, order = order[:size], order[size:]
        yield batch


def distil(policy, rows, cfg, r, device, pad_id):
    """--updates AdamW steps of --batch-size rows (batches); returns each update's loss and the indices of the rows
    trained on, in order."""
    dcfg = distil_config(cfg)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    losses, trained = [], []
    for update, batch in enumerate(batches(len(rows), cfg.batch_size, cfg, r)):
        T.set_lr(optimizer, T.lr_at(update, dcfg))
        losses.append(T.sft_update(policy, optimizer, [rows[i] for i in batch], dcfg, device, pad_id)["loss"])
        trained += batch
    return losses, trained


def rung_nll(policy, rows_by_rung, cfg, device, pad_id):
    """{rung: mean NLL per target token} over the first --loss-probe rows of each rung."""
    out = {}
    for rung, rows in rows_by_rung.items():
        nll, _, count = R.completion_sums(policy, rows[:cfg.loss_probe], pad_id, device, cfg.micro_batch_tokens)
        out[rung] = nll / max(count, 1)
    return out


def shares(weights):
    total = sum(weights.values())
    return {str(k): v / total if total else 0.0 for k, v in weights.items()}


# -----------------------------------------------------------------------------
# 2''. The baseline with the scaffold: Dr. GRPO on System 2's decomposed samples, rewarded by the label source


def label_records(out, q):
    """Round q's labelling records (round 0: pi_0's of the base replay, --base-labels own)."""
    return E.read_records(labels_dir(out, q) / "records.jsonl")[0]


def scaffold_groups(records, cfg):
    """The records whose samples --label-source splits, some accepted and some not, as Dr. GRPO's groups (a group
    all accepted or all rejected has every advantage 0): {id, level, record, rewards (1.0 accepted, else 0.0)}."""
    groups = []
    for rec in records:
        passed = R.label_accepts(rec, cfg.label_source, cfg.vote_min)
        if 0 < sum(passed) < len(passed):
            groups.append(dict(id=rec["id"], level=rec["level"], record=rec, rewards=[float(a) for a in passed]))
    return groups


def scaffold_rollouts(groups, by_id, tokenizer, negatives=True):
    """train_rl.Rollouts of the groups' samples: the problem's own prompt (System 1's), the joined decomposed
    response (then the stop token, where the last call stopped), the advantage by Dr. GRPO's row of OBJECTIVES
    (negatives False: the rejected samples' set to 0, --no-scaffold-negatives)."""
    eos = tokenizer.stop_token_ids(chat=TEMPLATE != "base")[0]
    rewards = torch.tensor([g["rewards"] for g in groups])
    advantages = OBJECTIVES["drgrpo"].advantages(rewards, rewards > 0, None)
    if not negatives:  # positive-sample reinforcement (Zhu et al. 2025): nothing pushed down
        advantages = advantages.clamp(min=0.0)
    advantages = advantages.tolist()
    rows = []
    for g, adv in zip(groups, advantages):
        p = by_id[g["id"]]
        prompt = tokenizer.encode(P.format_prompt(p["problem"], TEMPLATE))
        for j, (s, a) in enumerate(zip(E.samples_of(g["record"]), adv)):
            tokens = tokenizer.encode(s["response"]) + ([eos] if s["finish_reason"] == "stop" else [])
            rows.append(T.Rollout(problem=p, prompt=prompt, tokens=tokens, text=s["response"],
                                  finish_reason=s["finish_reason"], sampler_logprobs=[0.0] * len(tokens), seed=0,
                                  sample=j, passed=g["rewards"][j] > 0, reward=g["rewards"][j], advantage=a))
    return rows


def scaffold_learn(policy, groups, cfg, r, device, tokenizer, by_id):
    """--updates Dr. GRPO steps (update.policy_update with objectives' drgrpo row: -sum_i A_i sum_t log pi(o_it |
    x) / (--max-new-tokens x rows), Liu et al. 2025 sec. 3.2) of --batch-size / --samples groups (batches), lr as
    distillation's. The samples are the scaffold's, not System 1's: no importance ratio (rho = 1), as distillation
    imitates them. Returns each update's loss and the rollouts trained on."""
    rcfg = dataclasses.replace(distil_config(cfg), objective="drgrpo", max_new_tokens=cfg.max_new_tokens,
                               **OBJECTIVE_FLAGS, **OBJECTIVES["drgrpo"].defaults)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    run = T.Run(cfg=rcfg, policy=policy, sampler=policy, reference=None, optimizer=optimizer, tokenizer=tokenizer,
                train_set=[], device=device, selection={})
    losses, trained = [], []
    for update, batch in enumerate(batches(len(groups), max(1, cfg.batch_size // cfg.samples), cfg, r)):
        rows = scaffold_rollouts([groups[i] for i in batch], by_id, tokenizer, cfg.scaffold_negatives)
        T.set_lr(optimizer, T.lr_at(update, rcfg))
        losses.append(U.policy_update(run, rows, len(rows), sum(len(x.tokens) for x in rows))["loss"])
        trained += rows
    return losses, trained


# -----------------------------------------------------------------------------
# 2'. The baseline: Dr. GRPO on the round's problems (train_rl.train), dense then binary where --dense-steps


def rl_config(cfg, pool_path, val, start, run, steps, seed, prefix_credit):
    """train_rl's Config of one phase: the --rl-* settings, the climb's budget, --warmup then cosine decay (each
    phase re-warmed, as each round is), never evaluated (val is named so that none is carved from the pool)."""
    return T.Config(model=str(start), dataset=str(pool_path), subject="", num_problems=0, val_dataset=val,
                    test_dataset="", objective="drgrpo", steps=steps, problems_per_step=cfg.rl_problems_per_step,
                    group_size=cfg.rl_group_size, max_new_tokens=cfg.max_new_tokens, temperature=1.0,
                    grader="steps", prefix_credit=prefix_credit, lr=cfg.rl_lr, warmup_steps=min(cfg.warmup, steps),
                    schedule="cosine", save_every=0, eval_every=0, seed=seed, device=cfg.device, threads=cfg.threads,
                    out=str(run))


def rl_round(cfg, round_dir, r, pool, val):
    """--rl-steps of Dr. GRPO from round_{r-1}/ on pool: --dense-steps with --prefix-credit, then the binary reward.
    Returns the final checkpoint and the phases' summed totals (generated_tokens, training_tokens, flops)."""
    pool_path = round_dir / "rl_pool.jsonl"
    runs.write_jsonl(pool_path, pool)
    start, totals = round_dir.parent / f"round_{r - 1}", dict(generated_tokens=0, training_tokens=0, flops=0.0)
    phases = [(cfg.dense_steps, cfg.prefix_credit)] if cfg.dense_steps else []
    phases.append((cfg.rl_steps - cfg.dense_steps, 0.0))
    for i, (steps, credit) in enumerate(phases):
        run = round_dir / f"rl_{i}"
        shutil.rmtree(run, ignore_errors=True)  # a phase is redone whole after an interruption
        with contextlib.redirect_stdout(io.StringIO()):  # its per-step lines would drown the round's
            T.train(rl_config(cfg, pool_path, val, start, run, steps, ((cfg.seed * 1_009 + r) * 2 + i) % 2**32, credit))
        last = runs.read_log(run / "metrics.jsonl")[-1]
        totals = {k: totals[k] + last.get(k, 0) for k in totals}
        start = run / "final"
    return start, totals


def rl_learn(r, cfg, out, train, problems, tokenizer, device):
    """The baseline's round r: Dr. GRPO on its fresh problems beside --replay-ratio as many problems of the earlier
    rungs (the ladder's rungs below --start-rung and earlier rounds' problems); pi_r saved; the row's fields."""
    rung, round_dir = cfg.start_rung + r - 1, out / f"round_{r}"
    write_labelled_ids(out, r, problems)
    used = used_ids(out, r)
    earlier = by_rung([p for p in train[SPLITS[0][1]] if p["level"] < cfg.start_rung] +
                      [p for rows in train.values() for p in rows if p["id"] in used])
    pool = problems + replay(earlier, len(problems), cfg.replay_ratio, cfg.seed, r)
    final, totals = rl_round(cfg, round_dir, r, pool, split_of(rung, 2))
    R.save_policy(checkpoint.load_model(final, dtype=torch.float32, device=device), round_dir, tokenizer)
    return dict(round=r, rung=rung, label_dataset=split_of(rung, 1), problems_labelled=len(problems), solved=0,
                label_samples=0, traces_new=0, mix_by_rung={str(k): len(v) for k, v in by_rung(pool).items()},
                token_share_by_rung=None, loss_share_first_by_rung=None, loss_share_last_by_rung=None,
                updates=cfg.rl_steps, dense_steps=cfg.dense_steps, generated_tokens=totals["generated_tokens"],
                training_tokens=totals["training_tokens"], deliberation_flops=0.0, distillation_flops=totals["flops"])


# -----------------------------------------------------------------------------
# 3. Evaluate: fast per rung, the decomposed vote at the next rung


def per_rung(summary):
    """{rung: accuracy} of an evaluation summary grouped by level, in rung order."""
    return dict(sorted(R.per_group(summary).items(), key=lambda kv: int(kv[0])))


def evaluate(sampler, tokenizer, val_by_rung, cfg, eval_dir, vote_rung):
    """The row's evaluation fields: greedy step-valid accuracy per rung (evaluate.evaluate, grader steps) and the
    decomposed majority vote over --samples at vote_rung (rounds.decompose), when the ladder has it."""
    val = [p for rows in val_by_rung.values() for p in rows]
    _, fast = E.evaluate(sampler, tokenizer, val, cfg.max_new_tokens, batch_size=cfg.eval_batch_size, template=TEMPLATE,
                         grader="steps", group_by="level", out_dir=eval_dir / "fast",
                         dataset="+".join(s[2] for s in splits_for(cfg)))
    row = dict(fast_accuracy=fast["accuracy"], fast_n=fast["n"],
               fast_by_rung=per_rung(fast),
               eval_flops=fast["inference_flops"], vote_rung=None, vote_accuracy=None, vote_pass_at_k=None, vote_n=0)
    if vote_rung in val_by_rung:
        _, vote = R.decompose(sampler, tokenizer, val_by_rung[vote_rung], rounds_view(cfg), eval_dir / "vote", cfg.seed,
                              cfg.samples, split_of(vote_rung, 2))
        row.update(vote_rung=vote_rung, vote_accuracy=vote["accuracy"], vote_n=vote["n"],
                   vote_pass_at_k=vote.get("pass_at_k", {}).get(f"pass@{cfg.samples}"))
        row["eval_flops"] += vote["inference_flops"]
    return row


# -----------------------------------------------------------------------------
# 4. Test: each round's checkpoint, once, on the test splits (the run's own settings)


def first_errors(failed, top=5):
    """{"line i kind": share} of the top first errors (verify.first_error) of failed (response, problem text) pairs."""
    errors = collections.Counter(V.first_error(response, problem) for response, problem in failed)
    return {f"line {i + 1} {kind}": c / len(failed) for (i, kind), c in errors.most_common(top)}


def reach(sampler, tokenizer, rows, cfg, out_dir):
    """{rung: step-valid pass@--reach-samples at T = 1, pass@1, and the first errors of the failed samples}."""
    records, _ = E.evaluate(sampler, tokenizer, rows, cfg.max_new_tokens, cfg.eval_batch_size, template=TEMPLATE,
                            samples=cfg.reach_samples, temperature=1.0, seed=cfg.seed, out_dir=out_dir, grader="steps")
    out = {}
    for rung in sorted({p["level"] for p in rows}):
        mine = [(r, p) for r, p in zip(records, rows) if p["level"] == rung]
        failed = [(s["response"], p["problem"]) for r, p in mine for s in E.samples_of(r) if not s["correct"]]
        out[str(rung)] = dict(pass_at_k=sum(r["n_correct"] > 0 for r, _ in mine) / len(mine),
                              pass_at_1=sum(r["n_correct"] for r, _ in mine) / (len(mine) * cfg.reach_samples),
                              first_errors=first_errors(failed))
    return out


def test_round(r, cfg, out, test_by_rung, tokenizer, device):
    """Round r's test row: greedy per rung (2 to top_rung) on every test problem ({rung: rows}), the decomposed vote
    per rung on the first --test-vote-limit, and reach at the round's rung and one above on the first --reach-limit."""
    limit = cfg.test_limit or None
    _, sampler = R.load_policy(out / f"round_{r}", device)
    test_dir = out / f"round_{r}" / "test"
    _, fast = E.evaluate(sampler, tokenizer, [p for v in test_by_rung.values() for p in v[:limit]], cfg.max_new_tokens,
                         batch_size=cfg.eval_batch_size, template=TEMPLATE, grader="steps", group_by="level",
                         out_dir=test_dir / "fast", dataset="+".join(s[3] for s in splits_for(cfg)))
    _, vote = R.decompose(sampler, tokenizer, [p for v in test_by_rung.values() for p in v[:cfg.test_vote_limit]],
                          rounds_view(cfg), test_dir / "vote", cfg.seed, cfg.samples,
                          "+".join(s[3] for s in splits_for(cfg)))
    rung = cfg.start_rung + r - 1
    near = [p for k in (rung, rung + 1) if k in test_by_rung for p in test_by_rung[k][:cfg.reach_limit]]
    return dict(round=r, rung=rung if r else None, fast_by_rung=per_rung(fast), fast_n=fast["n"],
                vote_by_rung=per_rung(vote), vote_n=vote["n"], samples=cfg.samples, test_limit=cfg.test_limit,
                test_vote_limit=cfg.test_vote_limit,
                reach=reach(sampler, tokenizer, near, cfg, test_dir / "reach") if near else {},
                reach_samples=cfg.reach_samples,
                reach_limit=cfg.reach_limit, eval_flops=fast["inference_flops"] + vote["inference_flops"])


def run_config(out, context, flag):
    """The ClimbConfig of the climb run in `out` (config.json's `program` marks one; its settings ClimbConfig has), or
    one error line: `context` says who asks, `flag` names the directory's flag."""
    saved = runs.read_json_object(out / "config.json")
    if saved.get("program") != PROGRAM:
        what = "not found" if not (out / "config.json").is_file() else "not a climb run's (research/rounds/climb.py)"
        raise ValueError(f"{context}{out / 'config.json'}: {what}; {flag} must be a climb run's directory")
    return ClimbConfig(**{k: v for k, v in saved.items() if k in ClimbConfig.__dataclass_fields__})


def run_test(cfg):
    """--test: the run's own config (the --test flags from this command), every complete round not yet tested."""
    out = Path(cfg.out)
    saved = run_config(out, "--test: ", "--out")
    runs.claim(out, "climb", resume=True)  # one writer of test.jsonl and the rounds' test/ records at a time
    run_cfg = dataclasses.replace(saved, **{k: getattr(cfg, k) for k in (*TEST_FLAGS[1:], "device", "threads")})
    done = {row["round"] for row in runs.read_log(out / "test.jsonl", repair=True)}
    tokenizer, device = checkpoint.load_tokenizer(out / "round_0"), cfg.device or M.default_device()
    test_rows = [p for s in splits_for(run_cfg) for p in P.load_problems(s[3])]
    test_by_rung = {k: [p for p in test_rows if p["level"] == k] for k in rungs_for(run_cfg)}
    todo = [row["round"] for row in runs.read_log(out / "climb.jsonl", repair=True) if row["round"] not in done]
    if not todo:
        print(f"--test: every complete round of {out} (rounds {', '.join(map(str, sorted(done))) or 'none'}) is in "
              f"test.jsonl already, tested once with the settings recorded there; nothing to test (these --test "
              f"flags are not applied)", flush=True)
    for r in todo:
        test = test_round(r, run_cfg, out, test_by_rung, tokenizer, device)
        E.append_records(out / "test.jsonl", [test])
        fast, vote = (" ".join(f"{k}:{v:.2f}" for k, v in test[f].items()) for f in ("fast_by_rung", "vote_by_rung"))
        print(f"round {test['round']} test | fast {fast} | vote {vote}", flush=True)
    runs.release(out)
    return out


# -----------------------------------------------------------------------------
# The climb


def validation_rows(cfg):
    """Every validation problem of the run's rungs (its validation splits, whole)."""
    return [p for s in splits_for(cfg) for p in P.load_problems(s[2])]


def load_data(cfg):
    """({split: rows} of the training splits, {rung: validation rows}, --val-limit a rung), rungs 2 to top_rung."""
    train = {s[1]: P.load_problems(s[1]) for s in splits_for(cfg)}
    val = validation_rows(cfg)
    val_by_rung = {k: [p for p in val if p["level"] == k] for k in rungs_for(cfg)}
    return train, {k: rows[:cfg.val_limit] if cfg.val_limit else rows for k, rows in val_by_rung.items()}


def start_run(cfg, out):
    """Claim --out (config.json's `program` marks a climb run) and write config.json, or on --resume check it and
    the complete rounds' files (nothing is written when a check fails; the first run's config.json is kept);
    returns the complete rows of climb.jsonl."""
    config_path = out / "config.json"
    if cfg.resume:
        runs.check_out(out, "climb", resume=True)
        runs.check_resume(config_path, dataclasses.asdict(cfg), RESUMABLE, ClimbConfig)
        rows = runs.read_log(out / "climb.jsonl")
        runs.check_rounds_left(out, len(rows) - 1, cfg.rounds)
        if len(rows) <= cfg.rounds:  # rounds to go: they read the complete rounds' labelling records and traces
            check_round_files(out, rows, cfg)
    runs.claim(out, "climb", resume=cfg.resume)  # held until this process ends
    rows = runs.read_log(out / "climb.jsonl", repair=True)
    runs.write_config(config_path, dict(dataclasses.asdict(cfg), program=PROGRAM), cfg.resume, RESUMABLE)
    return rows


def check_round_files(out, rows, cfg):
    """--resume: each complete round's labelling records (the problems later rounds must not take again) and, when
    distilling, its traces (later rounds replay them) are on disk whole, as many as its row counts; a missing or
    damaged one is an error naming it: the rounds after it would silently learn from other data."""
    for row in rows[1:]:
        q = row["round"]
        files = [(labels_dir(out, q) / "records.jsonl", row["problems_labelled"], "labelling records")]
        if cfg.learner == "distil":
            files.append((out / f"traces_{q}.jsonl", row["traces_new"], "traces"))
        for path, n, what in files:
            if not path.is_file():
                raise FileNotFoundError(f"--resume: {path}: round {q}'s {what} are missing; the rounds after it "
                                        f"need them. Put the file back, or start the run again in a new --out")
            try:
                found = len(runs.read_log(path, strict=True))
            except ValueError as e:
                raise ValueError(f"--resume: {e}; round {q}'s {what} cannot be trusted. Put the file back, or "
                                 f"start the run again in a new --out") from None
            if found != n:
                raise ValueError(f"--resume: {path}: {found} rows where climb.jsonl's round {q} made {n}; the file "
                                 f"is damaged. Put it back, or start the run again in a new --out")


def run_round(r, cfg, out, data, tokenizer, device, rows, base):
    """Round r >= 1: pi_{r-1} labels rung k, pi_r is distilled from the mix, saved as round_r/ and evaluated."""
    train, val_by_rung = data
    t0, rung, round_dir = time.time(), cfg.start_rung + r - 1, out / f"round_{r}"
    shutil.rmtree(round_dir / "eval", ignore_errors=True)  # what pi_r made before an interruption is redone
    (round_dir / "model.safetensors").unlink(missing_ok=True)
    view, split = rounds_view(cfg), split_of(rung, 1)
    problems = fresh_problems(train[split], rung, cfg.label_problems, used_ids(out, r), order_seed(cfg))
    if not problems:
        raise ValueError(f"round {r}: {split} has no unused problem of rung {rung}")
    if cfg.learner == "drgrpo":  # the baseline: no labels; its System 1 learns the rung by RL (from disk)
        row = rl_learn(r, cfg, out, train, problems, tokenizer, device)
        return finish_row(row, r, cfg, out, val_by_rung, tokenizer, device, rows, t0)
    policy, sampler = R.load_policy(out / f"round_{r - 1}", device)  # pi_{r-1}: labels (sampler), then is distilled
    if cfg.labels == "generator":  # the control: every problem labelled, by the generator, at no deliberation cost
        write_labelled_ids(out, r, problems)
        new, label = worked_traces(problems, tokenizer, r, "generator"), dict(samples_total=0, inference_flops=0.0)
        solved, labels = len(problems), None
    else:
        records, label = R.decompose(sampler, tokenizer, problems, view, labels_dir(out, r),
                                     1_000 * (cfg.seed + 1) + r, cfg.samples, split)
        new = R.traces_for_round(records, view, r, tokenizer, cfg.label_source, cfg.vote_min)
        solved = sum(R.n_correct(rec) > 0 for rec in records)
        labels = {k: R.label_precision(records, view.selection, view.max_traces, k, cfg.vote_min)
                  for k in R.LABEL_SOURCES}
    runs.write_jsonl(out / f"traces_{r}.jsonl", new)
    by_id = {p["id"]: p for rows_ in train.values() for p in rows_}
    head = dict(round=r, rung=rung, label_dataset=split, problems_labelled=len(problems), solved=solved,
                label_samples=label["samples_total"], label_source=cfg.label_source, labels_by_source=labels,
                traces_new=len(new), deliberation_flops=label["inference_flops"] or 0.0)
    if cfg.learner == "scaffold":  # the same samples, learnt by Dr. GRPO (every sample rewarded) in place of imitation
        groups = scaffold_groups(records, cfg)
        earlier = by_rung([g for q in range(0 if cfg.base_replay else 1, r)
                           for g in scaffold_groups(label_records(out, q), cfg)])
        mix = groups + replay(earlier, len(groups), cfg.replay_ratio, cfg.seed, r) if len(groups) >= cfg.min_traces \
            else []
        losses, trained = scaffold_learn(policy, mix, cfg, r, device, tokenizer, by_id) if mix else ([], [])
        train_tokens, train_flops = R.training_flops(policy.config, [dict(
            prompt_tokens=len(x.prompt), target_tokens=len(x.tokens)) for x in trained], 1)
        R.save_policy(policy, round_dir, tokenizer)
        row = dict(head, groups_new=len(groups), mix_by_rung={str(k): len(v) for k, v in by_rung(mix).items()},
                   updates=len(losses), distil_loss_first=losses[0] if losses else None,
                   distil_loss_last=losses[-1] if losses else None, training_tokens=train_tokens,
                   distillation_flops=train_flops)
        return finish_row(row, r, cfg, out, val_by_rung, tokenizer, device, rows, t0)
    earlier = by_rung(base + [t for q in range(1, r) for t in runs.read_log(out / f"traces_{q}.jsonl")])
    mix = new + replay(earlier, len(new), cfg.replay_ratio, cfg.seed, r) if len(new) >= cfg.min_traces else []
    examples = R.trace_rows(mix, by_id, tokenizer, TEMPLATE)
    mix_rungs = by_rung(mix)
    tokens = {k: sum(t["target_tokens"] for t in v) for k, v in mix_rungs.items()}
    probe = {k: [e for e, t in zip(examples, mix) if int(t["level"]) == k] for k in mix_rungs} if cfg.loss_probe else {}
    nll_first = rung_nll(policy, probe, cfg, device, tokenizer.pad_id) if probe else {}
    losses, trained = distil(policy, examples, cfg, r, device, tokenizer.pad_id) if mix else ([], [])
    nll_last = rung_nll(policy, probe, cfg, device, tokenizer.pad_id) if probe else {}
    train_tokens, train_flops = R.training_flops(policy.config, [mix[i] for i in trained], 1)
    R.save_policy(policy, round_dir, tokenizer)
    row = dict(head, mix_by_rung={str(k): len(v) for k, v in mix_rungs.items()}, token_share_by_rung=shares(tokens),
               loss_share_first_by_rung=shares({k: nll_first[k] * tokens[k] for k in nll_first}) if nll_first else None,
               loss_share_last_by_rung=shares({k: nll_last[k] * tokens[k] for k in nll_last}) if nll_last else None,
               nll_first_by_rung={str(k): v for k, v in nll_first.items()} or None,
               nll_last_by_rung={str(k): v for k, v in nll_last.items()} or None,
               updates=len(losses), distil_loss_first=losses[0] if losses else None,
               distil_loss_last=losses[-1] if losses else None, training_tokens=train_tokens,
               distillation_flops=train_flops)
    return finish_row(row, r, cfg, out, val_by_rung, tokenizer, device, rows, t0)


def finish_row(row, r, cfg, out, val_by_rung, tokenizer, device, rows, t0):
    """Evaluate pi_r and append row r to climb.jsonl (the round is complete from then on)."""
    _, sampler = R.load_policy(out / f"round_{r}", device)
    row.update(evaluate(sampler, tokenizer, val_by_rung, cfg, out / f"round_{r}" / "eval", cfg.start_rung + r))
    row["round_flops"] = row.get("deliberation_flops", 0.0) + row.get("distillation_flops", 0.0)
    row["cumulative_flops"] = row["round_flops"] + (rows[-1]["cumulative_flops"] if rows else 0.0)
    row["seconds"] = time.time() - t0
    E.append_records(out / "climb.jsonl", [row])
    fast = " ".join(f"{k}:{v:.2f}" for k, v in row["fast_by_rung"].items())
    vote = f"vote@{cfg.samples} rung {row['vote_rung']} {row['vote_accuracy']:.2f}" if row["vote_rung"] else "no vote"
    solved = f"rung {row['rung']} solved {row['solved']}/{row['problems_labelled']} | " if r else ""
    for field, what in (("base_labels_by_source", "base "), ("labels_by_source", "")):
        if row.get(field):
            kept = row[field][cfg.label_source]
            steps, answer = ("-" if x is None else f"{x:.3f}" for x in (kept["precision_steps"],
                                                                        kept["precision_answer"]))
            solved += f"{what}{cfg.label_source} labels {kept['kept']}, precision steps {steps} answer {answer} | "
    print(f"round {r} | {solved}fast per rung {fast} | {vote} | {row['cumulative_flops']:.3g} FLOPs | "
          f"{row['seconds']:.0f} s", flush=True)
    return row


def run(cfg):
    check_config(cfg)
    out = Path(cfg.out)
    runs.check_out(out, "climb", cfg.resume)
    data = load_data(cfg)  # bad data fail before the run directory is written
    start = checkpoint.resolve_model_dir(cfg.start)  # a run directory or a missing round_N/ named as such
    tokenizer = checkpoint.load_tokenizer(cfg.start)
    context = checkpoint.read_config(start).max_position_embeddings
    P.check_prompts_fit([*data[0].items(), ("validation", [p for v in data[1].values() for p in v])], tokenizer,
                        TEMPLATE, cfg.max_new_tokens, context)
    device = cfg.device or M.default_device()
    torch.manual_seed(cfg.seed)
    pi_0 = None if cfg.resume else checkpoint.load_model(cfg.start, dtype=torch.float32, device=device)
    rows = start_run(cfg, out)  # bad weights fail before --out is claimed
    print(json.dumps(dataclasses.asdict(cfg)))
    if not rows:
        t0 = time.time()
        pi_0 = pi_0 if pi_0 is not None else checkpoint.load_model(cfg.start, dtype=torch.float32, device=device)
        R.save_policy(pi_0, out / "round_0", tokenizer)
        base, fields = base_traces(cfg, out, data[0], tokenizer, device)
        rows.append(finish_row(dict(round=0, rung=None, **fields), 0, cfg, out, data[1], tokenizer, device, rows, t0))
    else:
        base, _ = base_traces(cfg, out, data[0], tokenizer, device)
    for r in range(len(rows), cfg.rounds + 1):
        rows.append(run_round(r, cfg, out, data, tokenizer, device, rows, base))
    print(f"done: {out}")
    runs.release(out)
    return rows


def main(argv=None):
    cfg = cli.parse_config(ClimbConfig, argv, __doc__.split("\n\n")[0].strip(), prog="climb.py")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return run_test(cfg) if cfg.test else run(cfg)


if __name__ == "__main__":
    cli.run_main(main, "climb.py")
