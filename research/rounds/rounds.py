"""
System 2 -> System 1 rounds: verified deliberation trains the fast policy, and the fast policy then deliberates.

    python research/rounds/rounds.py --model tiny --dataset tiny_ladder_train --out runs/rounds/ladder  # the ladder, CPU
    python research/rounds/rounds.py --model tiny-ladder --dataset tiny_ladder_train --temperature 0.5 \
        --adaptive-samples 24 --num-problems 500 --epochs 2 --rounds 5 --fresh --schedule cosine --out runs/rounds/s
    python research/rounds/rounds.py --model Qwen/Qwen3-0.6B-Base --dataset math_train --out runs/rounds/qwen  # a GPU

Round r starts from the policy pi_r (pi_0 = --model) and does, each step one plain function call:
1. Deliberate (System 2) on the training pool: k samples per problem (--samples) at --temperature with the
   slow budget (--slow-max-new-tokens, may exceed the fast one), through evaluate.evaluate -> sample.generate,
   so the records, seeds and resume are the evaluation protocol's. Adaptive k (--adaptive-samples K): the
   problems where the first k found no verified trace get K more samples (their training answer is allowed
   here; nothing at evaluation sees one). --frontier T (the ladder): the round's pool is the rungs the fast
   policy solves at >= T on validation (the previous row) and the next one, a new rung at a time. --fresh:
   round r deliberates on the r-th block of --num-problems pool problems, never on a problem seen before.
   Rationalization (--rationalize, STaR's second half, Zelikman et al. 2022 sec. 3.2): the problems still without a
   verified trace are sampled again with their training answer stated after the problem (research/hint.py); a trace
   the grader accepts is distilled with the ordinary prompt. On the ladder the step check keeps a hint from paying
   a guess: only the problem's own chain counts.
2. Select the traces the grader accepts against the *training* answer (verify.grade, or verify.check_steps with
   --grader steps, which pays no lucky guess): at most --max-traces c per problem, rule --selection all (the
   first c accepted), distinct (the first c distinct texts) or shortest (the c shortest distinct texts);
   counts per level and per source (sample, adaptive, hint) are logged and the traces written to traces_N.jsonl.
3. Distil (System 1): next-token loss on the selected traces with the prompt tokens masked, from pi_r
   (--distil-from continue, STaR / expert iteration, Zelikman et al. 2022; Anthony et al. 2017) or from pi_0
   (--distil-from restart, ReST-EM, Singh et al. 2023). The update is train_rl.sft_update: the token-mean
   negative log-likelihood -sum(log p) / tokens, micro-batched, clipped and stepped as the RL update (tests
   check the value).
   --replay-share S keeps what was learnt: that share of the set is earlier rounds' traces, drawn at random.
4. Optional RL (--rl-steps N): train_rl.train from the distilled policy, called as a function.
5. Evaluate pi_{r+1} in both modes on the validation split with evaluate.evaluate: fast = the common
   protocol (greedy, one answer, --max-new-tokens); deliberate = majority vote over --eval-samples samples
   (no ground truth), with pass@k reported as coverage only; per level or subject, mean length, the policy's
   entropy on its greedy answers, and the round's compute (tokens and model.flops_per_token FLOPs).
6. pi_{r+1} deliberates in round r + 1 (Thinker, Chung 2024 sec. 5.4: deliberation improves the fast policy
   and the better fast policy deliberates better).

Row 0 of rounds.jsonl evaluates pi_0; row r >= 1 holds round r's deliberation (by pi_{r-1}), selection,
distillation, RL and the evaluation of pi_r = round_r/ (Hugging Face layout). A held-out --test-dataset is
evaluated after the last round only. Resume (--resume): a round is complete once its row is in rounds.jsonl;
an incomplete round is redone (its deliberation records, written by a policy already on disk, resume in
evaluate.py; everything after them is recomputed), so the result equals an uninterrupted run.
"""

import dataclasses
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import sys

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: the core, and research.*
import checkpoint  # noqa: E402
import cli  # noqa: E402
import distributed as D  # noqa: E402
import evaluate as E  # noqa: E402
import model as M  # noqa: E402
import problems as P  # noqa: E402
import runs  # noqa: E402
import sample  # noqa: E402
import train_rl as T  # noqa: E402
import verify  # noqa: E402
from research.hint import hinted  # noqa: E402

SELECTIONS = ("all", "distinct", "shortest")
DELIBERATIONS = ("sample", "decompose")
DISTIL_FROM = ("continue", "restart")
RESUMABLE = {"rounds", "resume", "device", "out"}  # may change on --resume (a moved run too); every other setting must match


data_arg, deliberate_arg, select_arg, distil_arg, rl_arg, run_arg = map(cli.arg_group, (
    "model and data", "System 2: deliberation on the training pool", "selection of verified traces",
    "System 1: distillation", "optional RL phase (train_rl.train, Dr. GRPO)", "evaluation and run"))


@dataclass
class RoundsConfig:
    model: str = data_arg(checkpoint.DEFAULT_MODEL, "pi_0: Hugging Face repo id, local checkpoint directory, or 'tiny'")
    dataset: str = data_arg("math_train", "training pool (deliberation and distillation)")
    subject: str = data_arg("", "keep only problems of this subject ('' keeps all)")
    num_problems: int = data_arg(500, "the first N problems of the pool deliberate each round (0: all)",
                                 range="[0, inf)")
    val_dataset: str = data_arg("", "validation set ('': carved from the pool, --val-size problems)")
    val_size: int = data_arg(200, "validation problems carved from the pool when --val-dataset is not given",
                             range="[0, inf)")
    val_limit: int = data_arg(0, "evaluate only the first N validation problems (0: all)", range="[0, inf)")
    test_dataset: str = data_arg("", "evaluated after the last round only, never used for a choice ('' skips)")
    test_limit: int = data_arg(0, "evaluate only the first N test problems (0: all)", range="[0, inf)")
    template: str = data_arg("base", "prompt template", choices=P.TEMPLATES)
    grader: str = data_arg("answer", "answer (verify.grade) or steps (verify.check_steps: the worked lines too)",
                           choices=verify.GRADERS)
    eval_group_by: str = data_arg("subject", "accuracy per value of this problem field ('' skips)")
    rounds: int = deliberate_arg(3, "rounds of deliberate -> select -> distil -> evaluate after round 0's evaluation "
                                    "(0: only evaluate --model in both modes, e.g. a baseline's checkpoint)",
                                 range="[0, inf)")
    samples: int = deliberate_arg(8, "k: samples per training problem", range="[1, inf)")
    temperature: float = deliberate_arg(1.0, "sampling temperature of deliberation and of the deliberate evaluation",
                                        range="(0, inf)")
    top_p: float = deliberate_arg(1.0, "nucleus sampling mass of the same", range="(0, 1]")
    max_new_tokens: int = deliberate_arg(512, "the fast budget: greedy evaluation (the baselines' protocol)",
                                         range="[1, inf)")
    slow_max_new_tokens: int = deliberate_arg(0, "the deliberation budget per sample (0: --max-new-tokens)",
                                              range="[0, inf)")
    deliberation: str = deliberate_arg("sample", "sample: k whole samples; decompose (tiny ladder only): each sample is "
                                                 "a chain of calls of the policy on sub-problems of at most --chunk-ops "
                                                 "operations", choices=DELIBERATIONS)
    chunk_ops: int = deliberate_arg(3, "decompose: operations per sub-problem (the rungs the fast policy already "
                                       "solves)", range="[1, inf)")
    merge_zero: bool = deliberate_arg(False, "decompose: a piece whose call boxes 0 is posed again joined to the "
                                             "next one (the tiny world starts no problem at 0, and a sub-problem "
                                             "from 0 is rarely solved); the discarded call's FLOPs still count")
    adaptive_samples: int = deliberate_arg(0, "adaptive k: this many more samples for problems with no verified trace "
                                              "yet (0: off)", range="[0, inf)")
    rationalize: bool = deliberate_arg(False, "STaR's rationalization: problems still without a verified trace after "
                                              "sampling (and adaptive k) are sampled again with the training answer "
                                              "stated in the prompt (research/hint.py); accepted traces are distilled "
                                              "with the ordinary prompt")
    rationalize_samples: int = deliberate_arg(0, "hinted samples per such problem (0: --samples)", range="[0, inf)")
    fresh: bool = deliberate_arg(False, "round r deliberates on the r-th block of --num-problems pool problems, not the "
                                        "same first N every round")
    frontier: float = deliberate_arg(0.0, "one new rung at a time (the ladder): each round uses the first "
                                          "--num-problems pool problems of level <= 1 + the last rung the fast policy "
                                          "solves at >= this (0: off)", range="[0, 1]")
    selection: str = select_arg("distinct", "all: first c accepted; distinct: first c distinct texts; shortest: the c "
                                            "shortest", choices=SELECTIONS)
    max_traces: int = select_arg(4, "c: at most this many selected traces per problem", range="[1, inf)")
    distil_from: str = distil_arg("continue", "continue: train pi_r; restart: train pi_0 on round r's traces (ReST-EM)",
                                  choices=DISTIL_FROM)
    replay_share: float = distil_arg(0.0, "keep what was learnt: this share of a round's distillation set is traces "
                                          "of earlier rounds, drawn at random (0: none)", range="[0, 0.9]")
    lr: float = distil_arg(1e-5, "AdamW learning rate of distillation", range="[0, inf)")
    epochs: int = distil_arg(2, "passes over the selected traces", range="[1, inf)")
    batch_size: int = distil_arg(32, "traces per distillation update", range="[1, inf)")
    warmup_steps: int = distil_arg(0, "linear warmup updates of distillation", range="[0, inf)")
    schedule: str = distil_arg("constant", "distillation lr after warmup: constant, cosine or linear decay to 0",
                               choices=("constant", "cosine", "linear"))
    weight_decay: float = distil_arg(0.0, "AdamW weight decay", range="[0, inf)")
    grad_clip: float = distil_arg(1.0, "max gradient norm (0: no clipping)", range="[0, inf)")
    micro_batch_tokens: int = distil_arg(4096, "padded tokens per forward/backward micro-batch", range="[1, inf)")
    rl_steps: int = rl_arg(0, "Dr. GRPO steps from the distilled policy each round (0: none)", range="[0, inf)")
    rl_lr: float = rl_arg(1e-5, "RL learning rate", range="[0, inf)")
    rl_problems_per_step: int = rl_arg(16, "RL: problems per step", range="[1, inf)")
    rl_group_size: int = rl_arg(8, "RL: samples per problem", range="[1, inf)")
    eval_samples: int = run_arg(0, "k of the deliberate evaluation (majority vote, pass@k; 0: --samples)",
                                range="[0, inf)")
    eval_batch_size: int = run_arg(64, "problems per generate call", range="[1, inf)")
    seed: int = run_arg(0, "seed of deliberation sampling, distillation order and the deliberate evaluation",
                        range="[0, 4294967295]")
    threads: int = run_arg(1, "torch CPU threads, as train_rl.py's --threads (0: one per core); the count moves float "
                              "rounding, so a resume keeps it", range="[0, inf)")
    device: str = run_arg("", "cuda or cpu (default: cuda when available)")
    out: str = run_arg("runs/rounds", "run directory")
    resume: bool = run_arg(False, "continue the run in --out: complete rounds are kept, an incomplete one redone")


# Settings the tiny world and the ladder bring to every script (train_rl's dicts; the rounds-only ones below).
SHARED_DEFAULTS = ("dataset", "subject", "val_dataset", "test_dataset", "max_new_tokens", "grader", "eval_group_by")
TINY_ROUNDS_DEFAULTS = dict(lr=5e-4, epochs=3, batch_size=16, num_problems=250, val_limit=250, test_limit=500)


def flag_defaults(first):
    out = {k: v for k, v in T.flag_defaults(first).items() if k in SHARED_DEFAULTS}
    if checkpoint.is_tiny_world(first.model):
        out.update(TINY_ROUNDS_DEFAULTS)
    return out


def check_config(cfg):
    """Refuse settings that cannot run, naming the flag (each flag's own range and choices are on its field)."""
    cli.check_fields(cfg)
    if cfg.deliberation == "decompose" and cfg.grader != "steps":
        raise ValueError("--deliberation decompose splits tiny-world expressions: it needs --grader steps (the tiny "
                         f"ladder), got --grader {cfg.grader}")
    if cfg.rationalize and cfg.deliberation == "decompose":
        raise ValueError("--rationalize hints whole samples; --deliberation decompose builds its own sub-problem prompts")
    if cfg.frontier and not (cfg.eval_group_by == "level" and cfg.val_dataset):
        raise ValueError(f"--frontier {cfg.frontier} reads the fast accuracy per level: it needs a value in (0, 1], "
                         f"--eval-group-by level and a --val-dataset, got {cfg.eval_group_by!r}, {cfg.val_dataset!r}")
    if cfg.fresh and (not cfg.num_problems or cfg.frontier):
        raise ValueError(f"--fresh takes the round's block of --num-problems problems: it needs --num-problems > 0 "
                         f"and no --frontier, got --num-problems {cfg.num_problems} --frontier {cfg.frontier}")
    cli.check_device(cfg.device)
    if cfg.rl_steps:  # the RL phase's settings, checked now rather than after round 0 is written
        try:
            T.check_config(rl_config(cfg, Path(cfg.out) / "round_1", 1, cfg.dataset, cfg.num_problems))
        except ValueError as e:
            raise ValueError(f"the RL phase (--rl-steps {cfg.rl_steps}): {rl_flags(str(e))}") from None
    if (cfg.eval_samples or cfg.samples) < 2:
        raise ValueError(f"--eval-samples {cfg.eval_samples} (0: --samples {cfg.samples}) must be >= 2: the deliberate "
                         f"mode votes over k samples")


def load_pools(cfg):
    """(train, val, test) with train_rl's rules (MATH-500 refused in train and val); --val-limit applied."""
    train, val, test = P.load_pools(dataclasses.replace(cfg, num_problems=0) if cfg.frontier or cfg.fresh else cfg)
    if cfg.fresh and len(train) < cfg.rounds * cfg.num_problems:
        raise ValueError(f"--fresh: {cfg.rounds} rounds of --num-problems {cfg.num_problems} need "
                         f"{cfg.rounds * cfg.num_problems} training problems; {cfg.dataset} has {len(train)}")
    val = val[:cfg.val_limit] if cfg.val_limit else val
    test = test[:cfg.test_limit] if cfg.test_limit else test
    if not train or not val:
        raise ValueError(f"--dataset {cfg.dataset!r} / --val-dataset {cfg.val_dataset!r}: the training pool has "
                         f"{len(train)} problems and validation {len(val)}; both need at least one")
    for name, rows in (("training pool", train), ("validation set", val), ("test set", test)):
        ids = [p["id"] for p in rows]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{name}: problem ids are not unique; every problem needs its own id")
    return train, val, test


# -----------------------------------------------------------------------------
# 1. Deliberate: k samples per training problem (adaptive k: more where none is verified)


def deliberate(policy, tokenizer, train_set, cfg, round_dir, r):
    """Records (evaluate.py's, one per problem, every sample kept) of k samples per problem, then --adaptive-samples
    more, in the same mode, for the problems with none accepted; the seeds are functions of (--seed, round, pass)."""
    budget = cfg.slow_max_new_tokens or cfg.max_new_tokens
    kw = dict(max_new_tokens=budget, batch_size=cfg.eval_batch_size, template=cfg.template, temperature=cfg.temperature,
              top_p=cfg.top_p, grader=cfg.grader, group_by=cfg.eval_group_by or None)

    def draw(problems, k, seed, out_dir):
        if cfg.deliberation == "decompose":
            return decompose(policy, tokenizer, problems, cfg, out_dir, seed, k, cfg.dataset)
        return E.evaluate(policy, tokenizer, problems, samples=k, seed=seed, out_dir=out_dir, dataset=cfg.dataset, **kw)

    records, summary = draw(train_set, cfg.samples, 1_000 * (cfg.seed + 1) + r, round_dir / "deliberate")
    passes = [summary]
    if cfg.adaptive_samples:
        unsolved = [p for p, rec in zip(train_set, records) if n_correct(rec) == 0]
        if unsolved:
            extra, s2 = draw(unsolved, cfg.adaptive_samples, 1_000 * (cfg.seed + 1) + 500 + r,
                             round_dir / "deliberate_adaptive")
            passes.append(s2)
            more = {rec["id"]: rec for rec in extra}
            records = [merge_samples(rec, more[rec["id"]], "adaptive") if rec["id"] in more else rec for rec in records]
    if cfg.rationalize:  # STaR's rationalization: the answer as a hint where sampling found nothing
        unsolved = [p for p, rec in zip(train_set, records) if n_correct(rec) == 0]
        if unsolved:
            rationalized, s3 = E.evaluate(
                policy, tokenizer, unsolved, samples=cfg.rationalize_samples or cfg.samples,
                seed=1_000 * (cfg.seed + 1) + 700 + r, out_dir=round_dir / "deliberate_hinted", dataset=cfg.dataset,
                hint=hinted, **kw)
            passes.append(s3)
            more = {rec["id"]: rec for rec in rationalized}
            records = [merge_samples(rec, more[rec["id"]], "hinted") if rec["id"] in more else rec for rec in records]
    return records, passes


def expression(start, steps):
    """A tiny-world problem text from its start value and (op, operand) steps, bracketed as tiny.make_problem
    brackets it (a product after a sum or difference wraps what came before)."""
    text, previous = str(start), None
    for op, b in steps:
        text = f"({text})" if op == "*" and previous in ("+", "-") else text
        text, previous = f"{text} {op} {b}", op
    return text


def chunk_sizes(n, chunk):
    """n operations in ceil(n / chunk) consecutive pieces as equal as possible, larger first: 4 by 3 -> 2, 2. With
    chunk >= 2 no piece has 1 operation, a shape the tiny world never shows (7 by 2 -> 3, 2, 2, not 2, 2, 2, 1)."""
    pieces = -(-n // chunk)
    while chunk >= 2 and pieces > 1 and n // pieces < 2:
        pieces -= 1
    return [n // pieces + (i < n % pieces) for i in range(pieces)]


def decompose(policy, tokenizer, problems, cfg, out_dir, seed, k, dataset):
    """Least-to-most deliberation (Zhou et al. 2023) on tiny-world problems: each of k samples solves the
    problem's operations --chunk-ops at a time, each piece a fresh call of the policy on a sub-problem that
    starts from the value the previous call boxed; the calls' worked lines are joined into one response, graded
    as any other. Only the problem text is used (read by verify.operations); the policy writes every
    line. Each sample lists its calls as [prompt tokens, completion tokens], whose FLOPs are the deliberation's.
Returns evaluate.py's records (one per problem, k samples) and summary; the records are the cache."""
    if (out_dir / "summary.json").exists():
        return E.read_records(out_dir / "records.jsonl")[0], json.loads((out_dir / "summary.json").read_text())
    t0, budget = time.time(), cfg.slow_max_new_tokens or cfg.max_new_tokens
    stop = tokenizer.stop_token_ids(chat=cfg.template != "base")
    parsed = [verify.operations(p["problem"]) for p in problems]
    # state per (problem, sample): the value so far, the steps left, the pieces' sizes, the lines written, tokens and
    # calls made, and where the last call started (its value, its steps and the lines before it)
    states = [dict(value=str(v), left=steps, sizes=chunk_sizes(len(steps), cfg.chunk_ops), head="", lines=[],
                   tokens=0, calls=[], finish="stop", box=None, last=None) for v, steps in parsed for _ in range(k)]
    j = 0
    while live := [i for i, s in enumerate(states) if s["left"] and s["value"] is not None]:
        prompts, seeds = [], []
        for i in live:
            s, n = states[i], states[i]["sizes"][0]
            s["last"] = (s["value"], s["left"][:n], len(s["lines"]))
            prompts.append(tokenizer.encode(P.format_prompt(expression(s["value"], s["left"][:n]), cfg.template)))
            seeds.append(((seed * 1_000_003 + i) * 16 + j) % 2**32)  # per (problem, sample, call)
        outs = sample.generate(policy, prompts, budget, temperature=cfg.temperature, top_p=cfg.top_p, n=1,
                                 stop_token_ids=stop, seed=seeds, pad_id=tokenizer.pad_id)
        for i, prompt, c in zip(live, prompts, outs):
            s, text = states[i], tokenizer.decode(c.tokens)
            s["left"], s["sizes"] = s["left"][s["sizes"][0]:], s["sizes"][1:]
            s["calls"].append([len(prompt), len(c.tokens)])
            s["tokens"] += len(c.tokens)
            lines = [line for line in text.strip().splitlines() if line.strip()]
            if not s["calls"][:-1]:  # the first call's leading whitespace (the tiny world's newline) opens the response
                s["head"] = text[:len(text) - len(text.lstrip())]
            s["box"] = verify.extract_answer(text)
            s["lines"] += [line for line in lines if "\\boxed" not in line]
            s["finish"] = c.finish_reason if c.finish_reason == "length" else s["finish"]
            s["value"] = s["box"] if s["box"] is not None and s["box"].isdigit() else None
            if cfg.merge_zero and s["box"] == "0" and s["left"]:  # never pose a sub-problem from 0: join the pieces
                value, steps, written = s["last"]
                s["value"], s["left"], s["lines"] = value, steps + s["left"], s["lines"][:written]
                s["sizes"] = [len(steps) + s["sizes"][0]] + s["sizes"][1:]
        j += 1
    groups = [[dict(response=s["head"] + "\n".join(s["lines"] + ([f"\\boxed{{{s['box']}}}"] if s["box"] is not None else [])),
                    completion_tokens=s["tokens"], finish_reason=s["finish"], calls=s["calls"])
               for s in states[i * k:(i + 1) * k]] for i in range(len(problems))]
    prompt_tokens = [len(tokenizer.encode(P.format_prompt(p["problem"], cfg.template))) for p in problems]
    records = E.grade_records(problems, prompt_tokens, groups, group_by=cfg.eval_group_by or None, grader=cfg.grader)
    for rec, group in zip(records, groups):  # grade_records keeps the fields it knows; the calls too
        for graded, g in zip(E.samples_of(rec), group):
            graded["calls"] = g["calls"]
    settings = dict(model=policy.name_or_path, dataset=dataset, mode="decompose", chunk_ops=cfg.chunk_ops,
                    merge_zero=cfg.merge_zero, samples=k,
                    temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=budget, grader=cfg.grader,
                    group_by=cfg.eval_group_by or None)
    summary = E.summarize(records, settings, wall_time=time.time() - t0)
    summary["inference_flops"] = decompose_flops(policy.config, records)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs.write_json(out_dir / "settings.json", settings)
    runs.write_jsonl(out_dir / "records.jsonl", records)
    runs.write_json(out_dir / "summary.json", summary)
    return records, summary


def decompose_flops(config, records):
    """Inference FLOPs of decomposed samples: every call's prefill and decoding (evaluate.inference_flops)."""
    calls = [dict(prompt_tokens=p, samples=[dict(completion_tokens=c)])
             for r in records for s in E.samples_of(r) for p, c in s["calls"]]
    return E.inference_flops(config, calls)


def n_correct(record):
    return sum(s["correct"] for s in E.samples_of(record))


def merge_samples(first, extra, source):
    """One record with the samples of both passes (the extra ones marked with their source), counts updated."""
    samples = E.samples_of(first) + [dict(s, **{source: True}) for s in E.samples_of(extra)]
    return dict(first, samples=samples, n_correct=sum(s["correct"] for s in samples))


# -----------------------------------------------------------------------------
# 2. Select verified traces


def fresh_problems(pool, r, n):
    """--fresh: round r's own block of n problems (round 1 the first n), so a round's traces are never on a
    problem an earlier round distilled: more questions, not the same ones again (the brief's control)."""
    return pool[(r - 1) * n:r * n]


def frontier_problems(pool, fast_by_level, threshold, n):
    """--frontier (one new rung at a time, as a curriculum climbs): the levels the fast policy solves, from the
    lowest up while its validation accuracy is >= threshold, and the next one; returns (the first n pool problems
    of those levels, n = 0: all, and the highest level kept). Distilling a new rung's decomposed traces next to the
    solved rungs' keeps them (research/rounds/README.md: rungs 4-6 traces distilled at once collapse the fast policy)."""
    top = min(int(p["level"]) for p in pool) - 1
    for level in sorted(int(k) for k in fast_by_level):
        if level != top + 1 or fast_by_level[str(level)] < threshold:
            break
        top = level
    keep = [p for p in pool if int(p["level"]) <= top + 1]
    return (keep[:n] if n else keep), top + 1


LABEL_SOURCES = ("key", "answer", "vote")  # where a trace's label comes from (climb.py --label-source)


def same_answer(sample, answer):
    """True when the sample's boxed answer equals `answer` (verify.is_equivalent); no box or no answer: False."""
    return answer is not None and sample["extracted"] is not None and verify.is_equivalent(sample["extracted"],
                                                                                            str(answer))


def vote_answer(record, min_votes):
    """The record's samples' plurality boxed answer (a sample without a box does not vote), or None when fewer than
    min_votes samples give it or another answer ties it for the top: a label from the samples alone, never the
    problem's answer."""
    answers = [s["extracted"] for s in E.samples_of(record)]
    top = E.majority_vote(answers)
    if top is None:
        return None
    agrees = [a is not None and verify.is_equivalent(a, answers[top]) for a in answers]
    rest = [None if agree else a for a, agree in zip(answers, agrees)]  # the runner-up's samples, the top's taken out
    second = E.majority_vote(rest)
    runner_up = 0 if second is None else sum(a is not None and verify.is_equivalent(a, rest[second]) for a in rest)
    return None if sum(agrees) < min_votes or runner_up == sum(agrees) else answers[top]


def label_accepts(record, source, min_votes=2):
    """Per sample of the record, whether its label source accepts it: `key` the grader's verdict (the step key on
    the tiny ladder: verify.check_steps), `answer` the boxed answer equals the problem's answer (the real task's
    verifier), `vote` it equals vote_answer's, the samples' own plurality (no answer used)."""
    target = record["answer"] if source == "answer" else vote_answer(record, min_votes) if source == "vote" else None
    return [s["correct"] if source == "key" else same_answer(s, target) for s in E.samples_of(record)]


def select_traces(record, rule, cap, source="key", min_votes=2):
    """The samples of one record to distil: accepted by the label source (label_accepts; `key`: the grader
    against the training answer) and ended by the stop token, at most `cap` of them: `all` the first accepted,
    `distinct` the first distinct texts, `shortest` the shortest distinct texts (ties: the one sampled first)."""
    ok = [s for s, a in zip(E.samples_of(record), label_accepts(record, source, min_votes))
          if a and s["finish_reason"] == "stop"]
    if rule != "all":
        seen, unique = set(), []
        for s in ok:
            if s["response"] not in seen:
                seen.add(s["response"])
                unique.append(s)
        ok = sorted(unique, key=lambda s: s["completion_tokens"]) if rule == "shortest" else unique
    return ok[:cap]


def trace_source(sample):
    """Which pass found a trace: sample (the first k), adaptive (adaptive k) or hint (rationalization)."""
    return "hint" if sample.get("hinted") else "adaptive" if sample.get("adaptive") else "sample"


def label_precision(records, rule, cap, source, min_votes=2):
    """What a label source keeps from the records, measured offline against the truth it may not use: traces kept,
    problems with one, and the share of kept traces the step key accepts (the grader's verdict) and whose boxed
    answer is the problem's (None when nothing is kept)."""
    kept = [(rec, select_traces(rec, rule, cap, source, min_votes)) for rec in records]
    traces = [(rec, s) for rec, chosen in kept for s in chosen]
    share = lambda ok: sum(ok) / len(traces) if traces else None  # noqa: E731
    return dict(kept=len(traces), problems=sum(bool(chosen) for _, chosen in kept),
                precision_steps=share([s["correct"] for _, s in traces]),
                precision_answer=share([same_answer(s, rec["answer"]) for rec, s in traces]))


def traces_for_round(records, cfg, r, tokenizer, source="key", min_votes=2):
    """Rows of traces_N.jsonl: one per trace select_traces keeps (under the label source); target_tokens is what
    distillation trains on (the response re-encoded plus the stop token)."""
    return [dict(round=r, id=rec["id"], level=rec.get("level"), subject=rec.get("subject"),
                 prompt_tokens=rec["prompt_tokens"], completion_tokens=s["completion_tokens"],
                 target_tokens=len(tokenizer.encode(s["response"])) + 1, adaptive=bool(s.get("adaptive")),
                 source=trace_source(s), response=s["response"])
            for rec in records for s in select_traces(rec, cfg.selection, cfg.max_traces, source, min_votes)]


# -----------------------------------------------------------------------------
# 3. Distil: next-token loss on the traces, prompt masked, through train_rl.sft_update


def trace_rows(traces, problems_by_id, tokenizer, template):
    """train_rl.sft_update's rows (train_rl.Example): prompt ids, completion ids (the response re-encoded, then the
    stop token, so the model learns to stop)."""
    eos = tokenizer.stop_token_ids(chat=template != "base")[0]
    rows = []
    for t in traces:
        tokens = tokenizer.encode(t["response"]) + [eos]
        rows.append(T.Example(tokenizer.encode(P.format_prompt(problems_by_id[t["id"]]["problem"], template)), tokens))
    return rows


def distil_config(cfg, n_updates):
    """train_rl's Config for the distillation updates (train_rl.sft_update, the token-mean NLL): the schedule of
    n_updates AdamW steps and the optimization settings."""
    return T.Config(lr=cfg.lr, warmup_steps=cfg.warmup_steps, schedule=cfg.schedule, steps=max(1, n_updates),
                    grad_clip=cfg.grad_clip, weight_decay=cfg.weight_decay, micro_batch_tokens=cfg.micro_batch_tokens)


def distil(policy, rows, cfg, r, device, pad_id):
    """--epochs passes over the rows in a seeded order, --batch-size rows per AdamW update; returns the mean
    NLL of each update and the completion tokens trained on."""
    n_updates = cfg.epochs * -(-len(rows) // cfg.batch_size)
    dcfg = distil_config(cfg, n_updates)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.999))
    losses, tokens, update = [], 0, 0
    for epoch in range(cfg.epochs):
        order = torch.randperm(len(rows), generator=torch.Generator().manual_seed((cfg.seed * 1_009 + r) * 1_009 + epoch))
        for start in range(0, len(rows), cfg.batch_size):
            batch = [rows[i] for i in order[start:start + cfg.batch_size].tolist()]
            T.set_lr(optimizer, T.lr_at(update, dcfg))
            stats = T.sft_update(policy, optimizer, batch, dcfg, device, pad_id)
            losses.append(stats["loss"])
            tokens += stats["tokens"]
            update += 1
    return losses, tokens


def replayed_traces(out, r, n_new, cfg):
    """--replay-share S: round r also distils S / (1 - S) traces of earlier rounds per new trace (of the rungs those
    rounds solved), drawn without replacement with a seed of (--seed, r) from traces_1..r-1.jsonl on disk."""
    if not cfg.replay_share or r == 1:
        return []
    older = [json.loads(line) for q in range(1, r) for line in (out / f"traces_{q}.jsonl").read_text().splitlines()
             if line.strip()]
    n = min(len(older), round(cfg.replay_share / (1 - cfg.replay_share) * max(n_new, 1)))
    return random.Random(f"replay-{cfg.seed}-{r}").sample(older, n)


def training_flops(config, traces, epochs):
    """Training FLOPs of distillation (train_rl's accounting): completion tokens x epochs x the training FLOPs
    per token at the mean context (prompt + half the target)."""
    if not traces:
        return 0, 0.0
    tokens = sum(t["target_tokens"] for t in traces) * epochs
    context = (sum(t["prompt_tokens"] for t in traces) + sum(t["target_tokens"] for t in traces) / 2) / len(traces)
    return tokens, tokens * M.flops_per_token(config, context, training=True)


# -----------------------------------------------------------------------------
# 4. Optional RL phase: train_rl.train from the distilled checkpoint


def rl_phase(cfg, round_dir, r, pool):
    """Dr. GRPO for --rl-steps from round_dir (its run in round_dir/rl) on the round's own pool (with --frontier:
    the rungs it deliberated on; with --fresh: the round's block; written to round_dir/rl_pool.jsonl); returns
    the run's final checkpoint and its compute (the run's last logged totals)."""
    run = round_dir / "rl"
    dataset, n = cfg.dataset, cfg.num_problems
    if cfg.frontier or cfg.fresh:
        dataset, n = str(round_dir / "rl_pool.jsonl"), 0
        round_dir.mkdir(parents=True, exist_ok=True)
        runs.write_jsonl(dataset, pool)
    rcfg = rl_config(cfg, round_dir, r, dataset, n)
    if not rcfg.resume:
        shutil.rmtree(run, ignore_errors=True)
    T.train(rcfg)
    last = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()][-1]
    return run / "final", dict(rl_steps=cfg.rl_steps, rl_generated_tokens=last.get("generated_tokens", 0),
                               rl_training_tokens=last.get("training_tokens", 0), rl_flops=last.get("flops", 0.0))


def rl_config(cfg, round_dir, r, dataset, n):
    """train_rl's Config of round r's RL phase (its run in round_dir/rl)."""
    run = round_dir / "rl"
    return T.Config(model=str(round_dir / "distilled"), dataset=dataset, subject=cfg.subject,
                    num_problems=n, val_dataset=cfg.val_dataset, val_size=cfg.val_size, test_dataset="",
                    template=cfg.template, objective="drgrpo", steps=cfg.rl_steps,
                    problems_per_step=cfg.rl_problems_per_step, group_size=cfg.rl_group_size,
                    max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, grader=cfg.grader, lr=cfg.rl_lr,
                    save_every=0, eval_every=0, seed=(cfg.seed * 1_009 + r) % 2**32, device=cfg.device,
                    threads=cfg.threads, out=str(run),
                    resume=(run / "metrics.jsonl").exists() and any((run / "checkpoints").glob("step_*")))


def rl_flags(message):
    """train_rl's flags in a message, spelled as this script's --rl-* flags."""
    for theirs, ours in (("--group-size", "--rl-group-size"), ("--problems-per-step", "--rl-problems-per-step"),
                         ("--lr", "--rl-lr"), ("--steps", "--rl-steps")):
        message = message.replace(theirs + " ", ours + " ")
    return message


# -----------------------------------------------------------------------------
# 5. Evaluate both modes; rows of rounds.jsonl


def evaluate_modes(policy, tokenizer, problems, cfg, out_dir, dataset):
    """Fast (greedy, one answer, the fast budget) and deliberate (majority vote over k samples) records and
    summaries, through evaluate.evaluate."""
    kw = dict(batch_size=cfg.eval_batch_size, template=cfg.template, grader=cfg.grader, dataset=dataset,
              group_by=cfg.eval_group_by or None)
    fast = E.evaluate(policy, tokenizer, problems, cfg.max_new_tokens, out_dir=out_dir / "fast", **kw)
    k = cfg.eval_samples or cfg.samples
    if cfg.deliberation == "decompose":  # System 2 at evaluation is the same procedure, then the vote
        return fast, decompose(policy, tokenizer, problems, cfg, out_dir / "deliberate", cfg.seed, k, dataset)
    slow = E.evaluate(policy, tokenizer, problems, cfg.slow_max_new_tokens or cfg.max_new_tokens, samples=k,
                      temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed, out_dir=out_dir / "deliberate", **kw)
    return fast, slow


@torch.no_grad()
def completion_sums(policy, rows, pad_id, device, micro_batch_tokens):
    """(summed NLL, summed entropy, token count) of the policy over rows' completion tokens (train_rl.Example rows)."""
    nll, entropy, count = 0.0, 0.0, 0
    for batch in T.micro_batches(rows, micro_batch_tokens):
        ids, mask = T.sequence_tensors(batch, pad_id, device)
        logp, ent = M.token_logprobs(policy, ids)
        nll, entropy = nll - float((logp.float() * mask).sum()), entropy + float((ent.float() * mask).sum())
        count += int(mask.sum())
    return nll, entropy, count


@torch.no_grad()
def greedy_entropy(policy, tokenizer, problems_by_id, records, template, device, micro_batch_tokens=4096):
    """Mean per-token entropy (nats) of the policy's next-token distribution along its own greedy answers."""
    rows = trace_rows([dict(id=r["id"], response=r["response"]) for r in records], problems_by_id, tokenizer, template)
    _, entropy, count = completion_sums(policy, rows, tokenizer.pad_id, device, micro_batch_tokens)
    return entropy / max(count, 1)


def per_group(summary):
    return {k: v["accuracy"] for k, v in summary.get("per_group", {}).items()}


def mode_fields(prefix, summary):
    """The rounds.jsonl fields of one evaluation, all from its summary (itself computed from the records)."""
    out = {f"{prefix}_accuracy": summary["accuracy"], f"{prefix}_ci95": summary["ci95"], f"{prefix}_n": summary["n"],
           f"{prefix}_by_group": per_group(summary), f"{prefix}_length_mean": summary["completion_tokens_mean"],
           f"{prefix}_tokens": summary["completion_tokens_total"], f"{prefix}_flops": summary["inference_flops"]}
    if "pass_at_k" in summary:
        out[f"{prefix}_pass_at_k"] = summary["pass_at_k"]
    return out


def deliberation_fields(records, passes, traces, group_by):
    """Deliberation and selection fields of a row, from the deliberation records and the selected traces."""
    def count_by(rows, key):
        out = {}
        for x in rows:
            out[str(x.get(key))] = out.get(str(x.get(key)), 0) + 1
        return dict(sorted(out.items()))
    solved = [r for r in records if n_correct(r) > 0]
    by_source = {}  # {source: {level: traces}}: where each rung's traces came from
    for t in traces:
        level = str(t.get(group_by or "level"))
        by_source.setdefault(t["source"], {})[level] = by_source.get(t["source"], {}).get(level, 0) + 1
    return dict(deliberation_problems=len(records), deliberation_samples=sum(p["samples_total"] for p in passes),
                deliberation_tokens=sum(p["completion_tokens_total"] or 0 for p in passes),
                deliberation_flops=sum(p["inference_flops"] or 0.0 for p in passes),
                hinted_samples=sum(p["samples_total"] for p in passes if p["settings"].get("hint")),
                hinted_problems=sum(p["n"] for p in passes if p["settings"].get("hint")),
                selected_by_source={k: dict(sorted(v.items())) for k, v in sorted(by_source.items())},
                adaptive_problems=sum(p["n"] for p in passes[1:] if not p["settings"].get("hint")),
                deliberation_solved=len(solved), deliberation_solved_by_group=count_by(solved, group_by or "level"),
                selected_traces=len(traces), selected_by_group=count_by(traces, group_by or "level"),
                selected_adaptive=sum(t["adaptive"] for t in traces),
                selected_length_mean=sum(t["completion_tokens"] for t in traces) / len(traces) if traces else None)


# -----------------------------------------------------------------------------
# The rounds


def start_run(cfg, out):
    """Claim --out (runs.claim: nothing else in it, no other process on it), write config.json or check it on
    --resume; returns the complete rows (a torn last line of a killed run is dropped)."""
    config_path = out / "config.json"
    if cfg.resume:
        runs.check_out(out, "rounds", resume=True)
        runs.check_resume(config_path, dataclasses.asdict(cfg), RESUMABLE, RoundsConfig)
        runs.check_rounds_left(out, len(runs.read_log(out / "rounds.jsonl")) - 1, cfg.rounds)
    runs.claim(out, "rounds", resume=cfg.resume)  # held until this process ends
    rows = runs.read_log(out / "rounds.jsonl", repair=True)
    runs.write_config(config_path, dataclasses.asdict(cfg), cfg.resume, RESUMABLE)  # a resume keeps the first's
    return rows


def load_policy(path, device):
    """(fp32 policy to train, the model to sample from: itself on CPU, a bf16 copy on CUDA), named by path."""
    policy = checkpoint.load_model(path, dtype=torch.float32, device=device)
    rollout = D.sampling_copy(policy, device)
    rollout.name_or_path = policy.name_or_path = str(path)
    return policy, rollout


def run_round(r, cfg, out, pools, tokenizer, device, rows):
    """Round r >= 1: pi_{r-1} deliberates, traces are selected and distilled into pi_r, saved as round_r/."""
    train_set, val_set = pools
    t0, round_dir = time.time(), out / f"round_{r}"
    for stale in ("eval", "distilled", "rl", "model.safetensors"):  # what pi_r made before an interruption is redone
        shutil.rmtree(round_dir / stale, ignore_errors=True) if stale != "model.safetensors" else \
            (round_dir / stale).unlink(missing_ok=True)
    _, sampler = load_policy(out / f"round_{r - 1}", device)
    top = None
    if cfg.frontier:  # the previous row's fast accuracy per rung picks this round's rungs
        train_set, top = frontier_problems(train_set, rows[-1]["fast_by_group"], cfg.frontier, cfg.num_problems)
    if cfg.fresh:
        train_set = fresh_problems(train_set, r, cfg.num_problems)
    records, passes = deliberate(sampler, tokenizer, train_set, cfg, round_dir, r)
    traces = traces_for_round(records, cfg, r, tokenizer)
    runs.write_jsonl(out / f"traces_{r}.jsonl", traces)
    replayed = replayed_traces(out, r, len(traces), cfg)
    policy, _ = load_policy(out / ("round_0" if cfg.distil_from == "restart" else f"round_{r - 1}"), device)
    by_id = {p["id"]: p for p in pools[0]}  # the whole pool: a replayed trace's problem is an earlier round's
    distilled = traces + replayed
    losses, trained = distil(policy, trace_rows(distilled, by_id, tokenizer, cfg.template), cfg, r, device,
                             tokenizer.pad_id) if distilled else ([], 0)
    train_tokens, train_flops = training_flops(policy.config, distilled, cfg.epochs)
    assert trained == train_tokens, (trained, train_tokens)  # the accounting counts what was trained on
    row = dict(round=r, **deliberation_fields(records, passes, traces, cfg.eval_group_by), replayed_traces=len(replayed),
               frontier_level=top, distil_from=cfg.distil_from, distil_updates=len(losses),
               distil_loss_first=losses[0] if losses else None, distil_loss_last=losses[-1] if losses else None,
               training_tokens=train_tokens, training_flops=train_flops,
               rl_steps=0, rl_generated_tokens=0, rl_training_tokens=0, rl_flops=0.0)
    if cfg.rl_steps:
        checkpoint.save_model(policy, round_dir / "distilled", tokenizer)
        final, rl = rl_phase(cfg, round_dir, r, train_set)
        policy = checkpoint.load_model(final, dtype=torch.float32, device=device)
        row.update(rl)
    save_policy(policy, round_dir, tokenizer)
    return finish_row(row, r, cfg, out, val_set, tokenizer, device, rows, t0)


def save_policy(policy, round_dir, tokenizer):
    """round_N/ in Hugging Face layout; the deliberation records beside it are kept (a resume reuses them)."""
    tmp = round_dir.with_name(f".{round_dir.name}.model")
    checkpoint.save_model(policy, tmp, tokenizer)
    round_dir.mkdir(parents=True, exist_ok=True)
    for f in tmp.iterdir():
        os.replace(f, round_dir / f.name)
    tmp.rmdir()


def finish_row(row, r, cfg, out, val_set, tokenizer, device, rows, t0):
    """Evaluate pi_r in both modes and append row r to rounds.jsonl (the round is complete from then on)."""
    policy, sampler = load_policy(out / f"round_{r}", device)
    (fast_records, fast), (_, slow) = evaluate_modes(sampler, tokenizer, val_set, cfg, out / f"round_{r}" / "eval",
                                                     cfg.val_dataset or cfg.dataset)
    row.update(mode_fields("fast", fast), **mode_fields("deliberate", slow))
    row["entropy"] = greedy_entropy(policy, tokenizer, {p["id"]: p for p in val_set}, fast_records, cfg.template, device,
                                    cfg.micro_batch_tokens)
    row["round_flops"] = row.get("deliberation_flops", 0.0) + row.get("training_flops", 0.0) + row.get("rl_flops", 0.0)
    row["cumulative_flops"] = row["round_flops"] + (rows[-1]["cumulative_flops"] if rows else 0.0)
    row["seconds"] = time.time() - t0
    E.append_records(out / "rounds.jsonl", [row])
    print_row(row, cfg)
    return row


def print_row(row, cfg):
    k = cfg.eval_samples or cfg.samples
    groups = " ".join(f"{g}:{row['fast_by_group'][g]:.2f}/{row['deliberate_by_group'].get(g, 0):.2f}"
                      for g in row["fast_by_group"])
    print(f"round {row['round']} | fast {row['fast_accuracy']:.3f} | deliberate@{k} {row['deliberate_accuracy']:.3f} | "
          f"pass@{k} {row['deliberate_pass_at_k'][f'pass@{k}']:.3f} | fast/deliberate per group {groups} | "
          f"selected {row.get('selected_traces', '-')} {row.get('selected_by_group', '')} | "
          f"len {row['fast_length_mean']:.0f} | {row['cumulative_flops']:.3g} FLOPs | {row['seconds']:.0f} s", flush=True)


def run(cfg):
    check_config(cfg)
    out = Path(cfg.out)
    runs.check_out(out, "rounds", cfg.resume)
    pools = load_pools(cfg)  # bad data fail before the run directory is written
    checkpoint.resolve_model_dir(cfg.model)
    tokenizer = checkpoint.load_tokenizer(cfg.model)
    context = checkpoint.read_config(checkpoint.resolve_model_dir(cfg.model)).max_position_embeddings
    P.check_prompts_fit(zip((cfg.dataset, cfg.val_dataset or "validation", cfg.test_dataset), pools), tokenizer,
                        cfg.template, max(cfg.max_new_tokens, cfg.slow_max_new_tokens), context)
    device = cfg.device or M.default_device()
    torch.manual_seed(cfg.seed)
    pi_0 = None if cfg.resume else checkpoint.load_model(cfg.model, dtype=torch.float32, device=device)  # bad
    rows = start_run(cfg, out)  # weights fail before --out is claimed
    print(json.dumps(dataclasses.asdict(cfg)))
    print(f"rounds: {len(pools[0])} training problems ({cfg.dataset}), validation {len(pools[1])}, device {device}")
    if not rows:
        save_policy(pi_0 if pi_0 is not None else checkpoint.load_model(cfg.model, dtype=torch.float32, device=device), out / "round_0",
                    tokenizer)
        rows.append(finish_row(dict(round=0), 0, cfg, out, pools[1], tokenizer, device, rows, time.time()))
    for r in range(len(rows), cfg.rounds + 1):
        rows.append(run_round(r, cfg, out, pools[:2], tokenizer, device, rows))
    test = pools[2]
    if test:  # the held-out test split: evaluated once, at the end, never used for a choice
        retire_test(out, f"round_{cfg.rounds}")
        _, sampler = load_policy(out / f"round_{cfg.rounds}", device)
        (_, fast), (_, slow) = evaluate_modes(sampler, tokenizer, test, cfg, out / "test", cfg.test_dataset)
        runs.write_json(out / "test.json", dict(round=cfg.rounds, **mode_fields("fast", fast),
                                             **mode_fields("deliberate", slow)))
        print(f"test ({cfg.test_dataset}, round {cfg.rounds}): fast {fast['accuracy']:.3f}, "
              f"deliberate {slow['accuracy']:.3f}")
    print(f"done: {out}")
    runs.release(out)
    return rows


def retire_test(out, last):
    """A run extended past the round its held-out test evaluated (--rounds raised on --resume): that evaluation
    moves into its own round's directory, kept whole, and the new last round is evaluated afresh in test/."""
    settings = out / "test" / "fast" / "settings.json"
    tested = Path(json.loads(settings.read_text())["model"]).name if settings.is_file() else last
    if tested != last:
        os.replace(out / "test", out / tested / "test")
        if (out / "test.json").is_file():
            os.replace(out / "test.json", out / tested / "test.json")


def main(argv=None):
    cfg = cli.parse_config(RoundsConfig, argv, __doc__.split("\n\n")[0], defaults=flag_defaults, prog="rounds.py")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return run(cfg)


if __name__ == "__main__":
    cli.run_main(main, "rounds.py")
