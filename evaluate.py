"""
The evaluation protocol: every accuracy this project reports comes from here.

    python evaluate.py --model Qwen/Qwen3-0.6B-Base --dataset math500
    python evaluate.py --model DIR --samples 16 --temperature 0.6 --top-p 0.95
    python evaluate.py --responses other_engine.jsonl --dataset math500
    python evaluate.py compare A/records.jsonl B/records.jsonl

Protocol (the defaults):
1. The problems of one data set (problems.py) in file order; `--limit N` takes the first N.
2. Prompt = problems.format_prompt(problem, template), the text training uses too: `base` (default) asks a
   base model for the final answer in \\boxed{}; `chat` / `chat_think` are Qwen3's chat template with
   thinking off / on. Tokenized without added special tokens.
3. Greedy decoding, at most 2,048 new tokens, stopping at <|endoftext|> (and <|im_end|> for the chat
   templates): one answer per problem. The response is the decoded completion, special tokens skipped.
4. Grading with verify.grade (last \\boxed{} answer, then equivalence), as the RL reward; its reward.py reward too.
5. Accuracy with a 95% Wilson interval, per subject and level where known; generated tokens, truncation
   rate (finish_reason 'length'), tokens/s and estimated inference FLOPs.
Multi-sample mode (`--samples k`, temperature > 0): k samples per problem. The problem's answer (`correct`,
`accuracy`) is the majority vote over equivalent extracted answers; samples without an answer do not vote;
a tie goes to the answer sampled first. pass@j for j = 1, 2, 4, ..., k is the unbiased estimator of Chen
et al. 2021 (eq. 1) over the same samples. With --dispersion (the CLI's default; evaluate(dispersion=True))
each problem's `dispersion` is the mean pairwise cosine distance of its k completions embedded by the evaluated
model itself (embedding_dispersion says what it can and cannot show); the summary has its mean over problems
and the embedding pass's time (`embedding_seconds`), about one more forward over every prompt and completion.

Outputs in --out DIR (default runs/eval/<model>-<dataset>): settings.json (the protocol, written first),
records.jsonl (one line per problem, appended and flushed per batch) and summary.json (at the end). A rerun
into DIR refuses another protocol, skips finished problems and redoes a partial last line left by a killed
run. Sampled runs repeat exactly, resumed or not: problem i is drawn with a seed made of (seed, i), and the
sampler makes a prompt's samples independent of the rest of its batch (the dispersion up to float rounding).
"""

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import checkpoint
import cli
import distributed as D
import memory
import model_options
import problems as P
import reward
import runs
import sample
import verify
from diversity import completion_embeddings, embedding_dispersion
from model import default_dtype, flops_per_token
from stats import bootstrap_paired, mcnemar_exact, pass_at_k, wilson

# settings that change the numbers: a resumed run must match all of them
PROTOCOL_KEYS = ("model", "dataset", "dtype", "template", "max_new_tokens", "samples", "temperature", "top_p", "seed",
                 "grader", "loop", "hint")
OLD_PROTOCOL = {"grader": "answer", "loop": "", "hint": False}  # what a settings.json written before a key existed meant

# -----------------------------------------------------------------------------
# Records: one JSON line per problem, appended per batch, so a killed run resumes


def samples_of(record):
    """A record's samples: its `samples` list in multi-sample mode, else the record itself."""
    return record.get("samples") or [record]


def read_records(path, partial_tail_ok=False):
    """The records of a records.jsonl, and the byte length of its newline-ended lines. With
    partial_tail_ok, a last line without its newline (a killed run) is left out, to be redone."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such records file")
    data = path.read_bytes()
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    records, seen = [], {}
    for lineno, line in enumerate(lines if partial_tail_ok else lines + [tail], 1):
        if not line.strip():
            continue
        r = P.parse_json_line(path, lineno, line)
        if "id" not in r or "correct" not in r:
            raise ValueError(f"{path}:{lineno}: not an evaluation record (needs 'id' and 'correct')")
        P.check_id(path, lineno, r)
        if r["id"] in seen:
            raise ValueError(f"{path}:{lineno}: id {r['id']!r} was already recorded on line {seen[r['id']]}")
        seen[r["id"]] = lineno
        records.append(r)
    return records, len(data) - len(tail)


def open_run(out_dir, settings, problems):
    """Start or resume DIR: check the protocol against settings.json, drop a partial last line, and
    return the finished records of these problems."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    settings_path, records_path = out_dir / "settings.json", out_dir / "records.jsonl"
    if settings_path.is_file():
        old = json.loads(settings_path.read_text())
        diff = [f"{k}: {old.get(k)!r} there, {settings[k]!r} now" for k in PROTOCOL_KEYS
                if old.get(k, OLD_PROTOCOL.get(k)) != settings[k]]
        if diff:
            raise ValueError(f"{out_dir}: holds an evaluation with another protocol ({'; '.join(diff)}); refusing "
                             f"to mix them. Use another --out, or delete {out_dir} to start over")
    elif records_path.is_file() and records_path.stat().st_size:
        raise ValueError(f"{records_path}: exists without settings.json, so its protocol cannot be checked; use "
                         f"another --out, or delete it to start over")
    else:
        runs.write_json(settings_path, settings)
    if not records_path.is_file():
        return []
    records, complete = read_records(records_path, partial_tail_ok=True)
    if complete < records_path.stat().st_size:
        print(f"{records_path}: dropping a partial last line (an interrupted run); that problem is redone",
              file=sys.stderr)
        os.truncate(records_path, complete)
    refs = {p["id"]: p["answer"] for p in problems}
    for r in records:
        if r["id"] in refs and r.get("answer") != refs[r["id"]]:
            raise ValueError(f"{records_path}: record {r['id']!r} has reference answer {r.get('answer')!r}, the "
                             f"data set {refs[r['id']]!r}: another version of the data set; use another --out")
    return [r for r in records if r["id"] in refs]


def append_records(path, records):
    """Append and sync to disk, so that a killed run loses at most the batch in flight."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


# -----------------------------------------------------------------------------
# Grading: samples -> records, with the checker the RL reward uses


def majority_vote(answers, equivalent=verify.is_equivalent):
    """Index of the sample whose answer wins the vote, or None when no sample has an answer.

    Each answer joins the first group whose first answer it is equivalent to; None does not vote.
    Tie rule: the group whose first sample came earliest wins.
    """
    groups = []  # [index of the group's first sample, votes]
    for i, a in enumerate(answers):
        if a is None:
            continue
        for g in groups:
            if equivalent(a, answers[g[0]]):
                g[1] += 1
                break
        else:
            groups.append([i, 1])
    return max(groups, key=lambda g: (g[1], -g[0]))[0] if groups else None


def grade_records(problems, prompt_tokens, samples, seconds=None, group_by=None, grader="answer"):
    """One record per problem from its samples (dicts with response, completion_tokens, finish_reason).
    `seconds` is the generation time per problem: its batch's time over the batch size. `group_by` names a
    problem field copied into the record (source, subject and level always are). `grader` 'steps' is the
    tiny ladder's rule (verify.check_steps: the worked lines must be the problem's chain)."""
    responses = [s["response"] for group in samples for s in group]
    correct = verify.grade_with(grader, responses, [p for p, group in zip(problems, samples) for _ in group])
    records, i = [], 0
    for p, n_prompt, group in zip(problems, prompt_tokens, samples):
        graded = []
        for s in group:
            box = verify.extract_answer(s["response"])
            graded.append(dict(extracted=box, correct=bool(correct[i]),
                               reward=reward.record_reward(correct[i], box is not None),
                               completion_tokens=s["completion_tokens"], finish_reason=s["finish_reason"],
                               response=s["response"]))
            i += 1
        record = dict(id=p["id"], source=p.get("source"), subject=p.get("subject"), level=p.get("level"),
                      answer=p["answer"], prompt_tokens=n_prompt)
        if group_by:
            record.setdefault(group_by, p.get(group_by))
        if len(graded) == 1:
            record.update(graded[0])
        else:  # the problem's answer is the vote's; all samples are kept for pass@k
            pick = majority_vote([g["extracted"] for g in graded])
            record.update(extracted=None if pick is None else graded[pick]["extracted"],
                          correct=pick is not None and graded[pick]["correct"], selected=pick,
                          n_correct=sum(g["correct"] for g in graded), samples=graded)
        if seconds is not None:
            record["seconds"] = seconds
        records.append(record)
    return records


# -----------------------------------------------------------------------------
# Evaluation: the function the training loop calls with its live model; the CLI is a layer on it


# Problems per sample.generate call, in batches, under continuous batching: batch_size x samples rows decode
# while the call's other problems wait to take the places of finished rows; records are flushed per call.
CALL_BATCHES = 4


def use_slots(model):
    """Continuous batching on CUDA, where a decode step costs about the same at 4 rows as at 64, so refilling
    finished rows' places saves steps; chunks on a CPU, where a step's cost follows its rows and the joins'
    cache copies cost more than they save (0.83-0.92x on the tiny ladder, k = 8). The completions are the same."""
    return next(model.parameters()).device.type == "cuda"


def evaluate(model, tokenizer, problems, max_new_tokens=2048, batch_size=64, template="base", samples=1,
             temperature=0.0, top_p=1.0, seed=0, out_dir=None, progress=False, dataset=None, group_by=None,
             compile=False, grader="answer", dispersion=False, continuous=None, hint=None):
    """Generate, grade and summarize; returns (records in problem order, summary). With out_dir, writes
    settings.json, records.jsonl (per batch) and summary.json there, resuming a run of the same protocol.
    With group_by (a problem field, e.g. "source"), summary["per_group"] is {value: {n, correct, accuracy}}.
    With dispersion and samples > 1, each record gets its samples' embedding_dispersion. `continuous` picks the
    sampler's continuous batching over chunks (default: use_slots); the records are the same either way.
    `progress` True (or a label for it) prints a progress line with an ETA on stderr. `hint`, a function of a problem
    row, gives each prompt's problem with its answer stated (research/hint.py's hinted: rationalization, training
    problems only, never part of an evaluation); settings.json then says hint: true."""
    if samples > 1 and temperature == 0:
        raise ValueError(f"samples={samples} needs temperature > 0: greedy samples are all the same")
    ids = [p["id"] for p in problems]
    if len(set(ids)) != len(ids):
        raise ValueError(f"problem ids are not unique (e.g. {next(i for i in ids if ids.count(i) > 1)!r})")
    stop = tokenizer.stop_token_ids(chat=template != "base")
    param = next(model.parameters())
    settings = dict(model=getattr(model, "name_or_path", None) or "unnamed",
                    dataset=dataset or "+".join(sorted({str(p.get("source")) for p in problems})),
                    dataset_hash=P.dataset_hash(problems), n_problems=len(problems), template=template,
                    max_new_tokens=max_new_tokens, samples=samples, temperature=temperature, top_p=top_p,
                    seed=seed if temperature > 0 else None,  # greedy ignores the seed
                    dtype=str(param.dtype).removeprefix("torch."), device=str(param.device),
                    batch_size=batch_size, stop_token_ids=stop, group_by=group_by, compile=compile, grader=grader,
                    **model_options.settings(model), hint=bool(hint))
    t0, unverified = time.time(), sum(verify.ERRORS.values())
    finished = {r["id"]: r for r in (open_run(out_dir, settings, problems) if out_dir else [])}
    todo = [(i, p) for i, p in enumerate(problems) if p["id"] not in finished]
    new_tokens, last_line = 0, time.time()
    continuous = use_slots(model) if continuous is None else continuous
    per_call = CALL_BATCHES * batch_size if continuous else batch_size
    for start in range(0, len(todo), per_call):
        batch = todo[start:start + per_call]
        prompts = [tokenizer.encode(P.format_prompt((hint(p) if hint else p)["problem"], template)) for _, p in batch]
        t = time.time()
        completions = sample.generate(model, prompts, max_new_tokens, temperature=temperature, top_p=top_p,
                                      n=samples, stop_token_ids=stop, pad_id=tokenizer.pad_id,
                                      seed=[(seed * 1_000_003 + i) % 2**32 for i, _ in batch],  # per problem
                                      compile=compile, slots=batch_size * samples if continuous else None)
        seconds = (time.time() - t) / len(batch)
        groups = [[dict(response=tokenizer.decode(c.tokens), completion_tokens=len(c.tokens),
                        finish_reason=c.finish_reason) for c in completions[j * samples:(j + 1) * samples]]
                  for j in range(len(batch))]
        records = grade_records([p for _, p in batch], [len(x) for x in prompts], groups, seconds, group_by, grader)
        if dispersion and samples > 1:  # each problem's samples in the model's own representation
            t = time.time()
            e = completion_embeddings(model, [prompts[c.prompt_index] for c in completions],
                                      [c.tokens for c in completions])
            per_problem = (time.time() - t) / len(batch)  # as `seconds`: the batch's time over its size
            for j, r in enumerate(records):
                r.update(dispersion=embedding_dispersion(e[j * samples:(j + 1) * samples]),
                         embedding_seconds=per_problem)
        if out_dir:
            append_records(Path(out_dir) / "records.jsonl", records)
        finished.update((r["id"], r) for r in records)
        new_tokens += sum(len(c.tokens) for c in completions)
        if progress:
            elapsed, done_now = time.time() - t0, start + len(batch)
            accuracy = sum(r["correct"] for r in finished.values()) / len(finished)
            eta = elapsed / done_now * (len(todo) - done_now)
            line = (f"{progress if isinstance(progress, str) else 'eval'}: {len(finished)}/{len(problems)} problems, "
                    f"accuracy so far {accuracy:.1%}, {new_tokens / elapsed:.0f} tok/s, ETA {eta / 60:.1f} min")
            if sys.stderr.isatty():  # a terminal: one line, rewritten in place
                print(f"\r{line} ", end="", file=sys.stderr, flush=True)
            elif done_now == len(todo) or time.time() - last_line > 30:  # a log file: a line every 30 s and the last
                print(line, file=sys.stderr, flush=True)
                last_line = time.time()
    if progress and todo and sys.stderr.isatty():
        print(file=sys.stderr)
    if sum(verify.ERRORS.values()) > unverified:  # a grading bug must not pass silently as "wrong"
        print(f"verify: {sum(verify.ERRORS.values()) - unverified} checks ended without a verdict and were graded "
              f"wrong (totals so far: {dict(verify.ERRORS)})", file=sys.stderr)
    records = [finished[i] for i in ids]
    if group_by:  # records resumed from a run without group_by lack the field: the problem has it
        for r, p in zip(records, problems):
            r.setdefault(group_by, p.get(group_by))
    summary = summarize(records, settings, config=model.config, wall_time=time.time() - t0)
    if out_dir:
        runs.write_json(Path(out_dir) / "summary.json", summary)
    return records, summary


def accuracy(model, tokenizer, problems, max_new_tokens, template="base", group_by=None, grader="answer",
             compile=False, label=""):
    """Greedy accuracy (the protocol) and {group: accuracy} per group_by value: what the training loop logs. Under
    torchrun each rank evaluates its share of the problems and the summary is recomputed from all the records."""
    records, summary = evaluate(model, tokenizer, D.rank_share(problems), max_new_tokens, batch_size=64,
                                template=template, group_by=group_by, compile=compile, grader=grader,
                                progress=label if D.this_rank() == 0 else False)
    if D.world_size() > 1:
        summary = summarize(D.gather_lists(records), dict(group_by=group_by))
    return summary["accuracy"], {str(k): v["accuracy"] for k, v in summary.get("per_group", {}).items()}


# -----------------------------------------------------------------------------
# Summary: computed from the records alone, so that anyone can recompute it


def breakdown(records, key, missing=None):
    """{value: {n, correct, accuracy}} per value of a record field; records without it are left out, or
    counted under `missing` when given."""
    groups = {}
    for r in records:
        value = missing if r.get(key) is None else r[key]
        if value is not None:
            groups.setdefault(str(value), []).append(bool(r["correct"]))
    return {k: dict(n=len(v), correct=sum(v), accuracy=sum(v) / len(v)) for k, v in sorted(groups.items())}


def inference_flops(config, records):
    """Forward FLOPs of generation: each prompt prefilled once (contexts 1..P), then one forward per
    generated token but the last (contexts P+1..P+m-1). model.flops_per_token is linear in the context,
    so a run of consecutive contexts costs exactly count x flops_per_token(mean context)."""
    total = 0.0
    for r in records:
        p = r["prompt_tokens"]
        total += p * flops_per_token(config, (1 + p) / 2)
        for s in samples_of(r):
            total += (s["completion_tokens"] - 1) * flops_per_token(config, p + s["completion_tokens"] / 2)
    return total


def summarize(records, settings, config=None, wall_time=None):
    """Accuracy (95% Wilson), pass@k, breakdowns, tokens, speed and FLOPs, from the records."""
    n, correct = len(records), sum(bool(r["correct"]) for r in records)
    flat = [s for r in records for s in samples_of(r)]
    k = max((len(samples_of(r)) for r in records), default=1)
    tokens = [s["completion_tokens"] for s in flat if s.get("completion_tokens") is not None]
    reasons = [s["finish_reason"] for s in flat if s.get("finish_reason") is not None]
    seconds = sum(r.get("seconds") or 0.0 for r in records)
    if k == 1:
        selection = "one response per problem" + (", greedy" if settings.get("temperature") == 0 else "")
    else:
        selection = (f"majority vote over {k} samples per problem: equivalent extracted answers are pooled, "
                     f"samples without an answer do not vote, a tie goes to the answer sampled first")
    summary = dict(model=settings.get("model") or settings.get("responses"), dataset=settings.get("dataset"),
                   dataset_hash=settings.get("dataset_hash"), selection=selection, n=n, correct=correct,
                   accuracy=correct / n if n else None, ci95=list(wilson(correct, n)))
    if k > 1:
        ks = sorted({2**i for i in range(k.bit_length()) if 2**i < k} | {k})
        summary["pass_at_k"] = {f"pass@{j}": float(np.mean([pass_at_k(len(samples_of(r)), r["n_correct"], j)
                                                            for r in records])) for j in ks}
        dispersions = [r["dispersion"] for r in records if r.get("dispersion") is not None]  # not from --responses
        summary.update(dispersion_mean=float(np.mean(dispersions)) if dispersions else None,
                       embedding_seconds=sum(r.get("embedding_seconds") or 0.0 for r in records) or None)
    summary.update(
        by_subject=breakdown(records, "subject"), by_level=breakdown(records, "level"),
        **({"per_group": breakdown(records, settings["group_by"], missing="?")} if settings.get("group_by") else {}),
        mean_reward=float(np.mean([s["reward"] for s in flat])) if flat else None, samples_total=len(flat),
        completion_tokens_total=sum(tokens) if tokens else None,
        completion_tokens_mean=sum(tokens) / len(tokens) if tokens else None,
        prompt_tokens_total=sum(r.get("prompt_tokens") or 0 for r in records),
        truncation_rate=reasons.count("length") / len(reasons) if reasons else None,
        generation_seconds=seconds or None, tokens_per_s=sum(tokens) / seconds if seconds and tokens else None,
        wall_time_s=wall_time, inference_flops=inference_flops(config, records) if config and flat else None,
        layer_passes=config.layer_passes if config else None,  # per token; more when a model option reruns layers
        settings=settings)
    return summary


def format_summary(s):
    pct = "{:.1%}".format
    lines = [f"model      {s['model']}", f"dataset    {s['dataset']} (n={s['n']}, hash {s['dataset_hash']})",
             f"selection  {s['selection']}",
             f"accuracy   {pct(s['accuracy'])}  95% CI [{pct(s['ci95'][0])}, {pct(s['ci95'][1])}] (Wilson), "
             f"{s['correct']}/{s['n']} correct"
             + (" (grader steps: worked lines checked)" if s["settings"].get("grader") == "steps" else "")]
    if "pass_at_k" in s:
        lines.append("pass@k     " + ", ".join(f"{k} {pct(v)}" for k, v in s["pass_at_k"].items()))
    if s.get("dispersion_mean") is not None:
        cost = f", {pct(s['embedding_seconds'] / s['generation_seconds'])} of the generation time" \
            if s.get("embedding_seconds") and s.get("generation_seconds") else ""
        lines.append(f"dispersion {s['dispersion_mean']:.4f} mean pairwise cosine distance of a problem's samples "
                     f"(the model's own embeddings; embedding pass {s['embedding_seconds'] or 0:.1f} s{cost})")
    if "per_group" in s:
        lines.append(f"per {s['settings']['group_by']:<6} " + ", ".join(
            f"{k} {pct(v['accuracy'])} ({v['correct']}/{v['n']})" for k, v in s["per_group"].items()))
    if s["completion_tokens_total"] is not None:
        truncated = "" if s["truncation_rate"] is None else f", truncated {pct(s['truncation_rate'])}"
        lines.append(f"tokens     {s['completion_tokens_total']:,} generated in {s['samples_total']} samples "
                     f"(mean {s['completion_tokens_mean']:.1f}){truncated}")
    if s["tokens_per_s"]:
        flops = f", {s['inference_flops']:.3g} inference FLOPs" if s["inference_flops"] else ""
        if s["settings"].get("loop"):
            flops += f" ({s['layer_passes']} layer passes per token, --loop {s['settings']['loop']})"
        lines.append(f"speed      {s['tokens_per_s']:.1f} tok/s over {s['generation_seconds']:.1f} s of generation"
                     f"{flops}")
    return "\n".join(lines)


# -----------------------------------------------------------------------------
# Grading responses produced elsewhere, with the same checker and summary


def read_responses(path, problems):
    """{id: rows} from a JSONL of {id, response[, completion_tokens, finish_reason]}. An id may repeat
    (several samples of one problem); every problem needs the same number of responses."""
    path, groups = Path(path), {p["id"]: [] for p in problems}
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such responses file")
    for lineno, row in P.read_jsonl(path):
        if "id" not in row or not isinstance(row.get("response"), str):
            raise ValueError(f"{path}:{lineno}: each row needs 'id' and 'response' (a string)")
        P.check_id(path, lineno, row)
        if row["id"] not in groups:
            raise ValueError(f"{path}:{lineno}: unknown id {row['id']!r}: not a problem of this data set "
                             f"(or beyond --limit)")
        if row.get("finish_reason") not in (None, "stop", "length") or \
                not isinstance(row.get("completion_tokens", 0), int):
            raise ValueError(f"{path}:{lineno}: finish_reason must be 'stop' or 'length', completion_tokens "
                             f"an integer")
        groups[row["id"]].append(row)
    missing = [i for i, g in groups.items() if not g]
    if missing:
        raise ValueError(f"{path}: no response for {len(missing)} of {len(groups)} problems (e.g. {missing[0]!r}); "
                         f"grade a subset with --limit N (the first N problems)")
    if len({len(g) for g in groups.values()}) > 1:
        raise ValueError(f"{path}: problems have different numbers of responses; pass@k and the majority vote "
                         f"need the same number for every problem")
    return groups


def count_tokens(tokenizer, text):
    return len(tokenizer.encode(text)) if tokenizer else None


def grade_responses(path, problems, tokenizer=None, template="base", out_dir=None, dataset=None, group_by=None,
                    grader="answer"):
    """Records and summary for responses from another engine. Token counts come from the rows or else from
    `tokenizer`; finish reasons only from the rows. With out_dir, the files are (re)written there."""
    groups = read_responses(path, problems)
    samples = [[dict(response=row["response"], finish_reason=row.get("finish_reason"),
                     completion_tokens=row.get("completion_tokens", count_tokens(tokenizer, row["response"])))
                for row in groups[p["id"]]] for p in problems]
    prompt_tokens = [count_tokens(tokenizer, P.format_prompt(p["problem"], template)) for p in problems]
    settings = dict(mode="responses", responses=str(path), model=None,
                    dataset=dataset or "+".join(sorted({str(p.get("source")) for p in problems})),
                    dataset_hash=P.dataset_hash(problems), n_problems=len(problems), template=template,
                    samples=len(samples[0]), tokenizer=str(tokenizer.path) if tokenizer else None, group_by=group_by,
                    grader=grader)
    t0 = time.time()
    records = grade_records(problems, prompt_tokens, samples, group_by=group_by, grader=grader)
    summary = summarize(records, settings, wall_time=time.time() - t0)
    if out_dir:
        out_dir = Path(out_dir)
        old = json.loads((out_dir / "settings.json").read_text()) if (out_dir / "settings.json").is_file() else {}
        if old and old.get("responses") != str(path):
            raise ValueError(f"{out_dir}: holds another evaluation ({old.get('responses') or old.get('model')}); "
                             f"grade into another --out")
        out_dir.mkdir(parents=True, exist_ok=True)
        runs.write_json(out_dir / "settings.json", settings)
        (out_dir / "records.jsonl").unlink(missing_ok=True)  # regrading is idempotent: rewrite, not resume
        append_records(out_dir / "records.jsonl", records)
        runs.write_json(out_dir / "summary.json", summary)
    return records, summary


# -----------------------------------------------------------------------------
# Comparing two evaluations of the same problems


def compare(path_a, path_b, n_boot=10_000, seed=0):
    """Paired comparison of two records files: the difference B - A with a bootstrap interval, the
    discordant counts and an exact McNemar test."""
    a = {r["id"]: r for r in read_records(path_a)[0]}
    b = {r["id"]: r for r in read_records(path_b)[0]}
    only_a, only_b = [i for i in a if i not in b], [i for i in b if i not in a]
    if only_a or only_b or not a:
        raise ValueError(f"{path_a} and {path_b} cover different problems ({len(only_a)} only in the first, "
                         f"{len(only_b)} only in the second, {len(a) - len(only_a)} in both); compare two "
                         f"evaluations of the same data set and --limit")
    for i in a:
        if a[i].get("answer") != b[i].get("answer"):
            raise ValueError(f"problem {i!r} has reference answer {a[i].get('answer')!r} in {path_a} but "
                             f"{b[i].get('answer')!r} in {path_b}: different versions of the data set")
    ca, cb = [bool(a[i]["correct"]) for i in a], [bool(b[i]["correct"]) for i in a]
    diff, ci = bootstrap_paired(ca, cb, n_boot, seed)
    pairs = list(zip(ca, cb))
    only_a, only_b = pairs.count((True, False)), pairs.count((False, True))
    return dict(a=str(path_a), b=str(path_b), n=len(pairs), accuracy_a=sum(ca) / len(ca),
                accuracy_b=sum(cb) / len(cb), difference=diff, ci95=list(ci), n_boot=n_boot,
                both_correct=pairs.count((True, True)), only_a_correct=only_a, only_b_correct=only_b,
                neither_correct=pairs.count((False, False)), mcnemar_p=mcnemar_exact(only_a, only_b))


def format_compare(c):
    return (f"A      {c['a']}: {c['accuracy_a']:.1%}\n"
            f"B      {c['b']}: {c['accuracy_b']:.1%}   (n={c['n']} paired problems)\n"
            f"B - A  {100 * c['difference']:+.1f} points, 95% bootstrap CI [{100 * c['ci95'][0]:+.1f}, "
            f"{100 * c['ci95'][1]:+.1f}]\n"
            f"pairs  both right {c['both_correct']}, only A right {c['only_a_correct']}, only B right "
            f"{c['only_b_correct']}, both wrong {c['neither_correct']} (exact McNemar p = {c['mcnemar_p']:.3g})")


# -----------------------------------------------------------------------------
# CLI: flags generated from the config dataclass (cli.py)


data_arg, sampling_arg, run_arg = map(cli.arg_group, ("model and data", "protocol", "run"))


@dataclass
class EvalConfig(memory.MemoryConfig, model_options.ModelOptions):
    HELP_GROUPS = ("model and data", "model options", "protocol", "run")  # the memory plan's flags after these
    model: str = data_arg(checkpoint.DEFAULT_MODEL, "checkpoint directory, tiny, tiny-ladder, or a Hugging Face repo id")
    dataset: str = data_arg("math500", f"{', '.join(P.DATASETS)}, or a .jsonl path with 'problem' and 'answer'")
    limit: int | None = data_arg(None, "evaluate only the first N problems", range="[1, inf)")
    responses: str | None = data_arg(None, "grade this JSONL of {id, response} from another engine instead of "
                                           "generating (--model then only supplies the tokenizer for token counts)")
    template: str = sampling_arg("base", "prompt template (problems.format_prompt)", choices=P.TEMPLATES)
    max_new_tokens: int = sampling_arg(2048, "generation budget per sample", range="[1, inf)")
    samples: int = sampling_arg(1, "samples per problem; > 1 reports pass@k and the majority vote (needs --temperature)",
                                range="[1, inf)")
    temperature: float = sampling_arg(0.0, "sampling temperature; 0 is greedy", range="[0, inf)")
    top_p: float = sampling_arg(1.0, "nucleus sampling mass, in (0, 1]", range="(0, 1]")
    seed: int = sampling_arg(0, "sampling seed (problem i is drawn with a seed made of (seed, i), whatever the batch)")
    grader: str = sampling_arg("answer", "answer: verify.grade (the final answer); steps: the tiny ladder's rule, the "
                                         "worked lines must be the problem's chain too (verify.check_steps)",
                               choices=verify.GRADERS)
    group_by: str | None = sampling_arg(None, "also report accuracy per value of this problem field (e.g. source); "
                                              "problems without the field count under '?'")
    dispersion: bool = sampling_arg(True, "with --samples > 1, the mean pairwise cosine distance of each problem's "
                                          "samples embedded by the model (diversity.py): one more forward over every "
                                          "prompt and completion")
    dtype: str | None = run_arg(None, "weights dtype (default bfloat16 on GPU, float32 on CPU)",
                                choices=("float32", "bfloat16", "float16"))
    device: str = run_arg("", "cuda, cuda:N or cpu ('': cuda when available)")
    batch_size: int = run_arg(64, "problems whose samples decode together (on CUDA, continuous batching: a finished "
                                  "row's place goes to a waiting problem); records are flushed after each call",
                              range="[1, inf)")
    compile: bool = run_arg(False, "the sampler's static decode step in a CUDA graph (slower on a CPU)")
    continuous: bool | None = run_arg(None, "continuous batching (default: on CUDA; chunks on a CPU); the records are "
                                            "the same either way")
    threads: int = run_arg(0, "torch CPU threads (0: one per core); on a machine another job keeps busy, 1 is faster "
                              "(benchmarks/bench_threads.py)", range="[0, inf)")
    out: str | None = run_arg(None, "output directory (default runs/eval/<model>-<dataset>)")


# The tiny world (--model tiny, or a model trained from it): its test split, a budget that fits its context.
TINY_DEFAULTS = dict(dataset="tiny_test", max_new_tokens=64, group_by="level")
# The tiny ladder (--dataset tiny_ladder_val or _test): its budget fits the top rung, its grader checks the steps.
LADDER_DEFAULTS = dict(max_new_tokens=128, group_by="level", grader="steps")
EPILOG = cli.world_epilog(TINY_DEFAULTS, LADDER_DEFAULTS,
                          "`evaluate.py compare A B [--n-boot N --seed S]` compares two records files.")


def flag_defaults(first):
    """The tiny world's defaults with its model, the ladder's with its data sets; flags given still win."""
    out = dict(TINY_DEFAULTS) if checkpoint.is_tiny_world(first.model) else {}
    out.update(LADDER_DEFAULTS if Path(first.dataset).stem.startswith("tiny_ladder") else {})
    return out


def check_config(cfg):
    """Refuse flag values that cannot run, naming the flag (each flag's own range and choices are on its field)."""
    cli.check_fields(cfg)
    if cfg.samples > 1 and cfg.temperature == 0 and not cfg.responses:
        raise ValueError(f"--samples {cfg.samples} needs --temperature > 0: greedy samples are all the same")
    model_options.check(cfg)  # the syntax before the model loads; the layer range once its config.json is read
    cli.check_device(cfg.device)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["compare"]:
        parser = argparse.ArgumentParser(prog="evaluate.py compare", description="Paired comparison B - A of "
                                         "two records.jsonl files of the same problems.")
        parser.add_argument("a")
        parser.add_argument("b")
        parser.add_argument("--n-boot", type=int, default=10_000, help="bootstrap resamples")
        parser.add_argument("--seed", type=int, default=0, help="bootstrap seed")
        args = parser.parse_args(argv[1:])
        if args.n_boot < 1:
            raise ValueError(f"--n-boot must be at least 1, got {args.n_boot}")
        result = compare(args.a, args.b, args.n_boot, args.seed)
        print(format_compare(result))
        return result
    cfg = cli.parse_config(EvalConfig, argv, "Evaluate a model on a math data set (the protocol: evaluate.py's "
                           "docstring).", defaults=flag_defaults, epilog=EPILOG, prog="evaluate.py")
    check_config(cfg)
    problems = P.load_problems(cfg.dataset, cfg.limit)
    # runs/grpo/final -> grpo-final; Qwen/Qwen3-0.6B-Base -> Qwen3-0.6B-Base
    name = Path(cfg.responses).stem if cfg.responses else \
        "-".join(Path(cfg.model).parts[-2:]) if Path(cfg.model).is_dir() else Path(cfg.model).name
    name += f"-loop{cfg.loop.replace(':', '-')}" if cfg.loop else ""
    out = Path(cfg.out or f"runs/eval/{name}-{Path(cfg.dataset).stem}")
    runs.check_out(out, "eval", resume=True)
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    runs.set_threads(cfg.threads, device)
    tokenizer = checkpoint.load_tokenizer(cfg.model)
    if cfg.responses:
        read_responses(cfg.responses, problems)  # a malformed file fails before --out is made
        P.check_prompts_fit([(cfg.dataset, problems)], tokenizer, cfg.template, 0, float("inf"))  # encodable
        runs.claim(out, "eval", resume=True)  # held until this process ends
        _, summary = grade_responses(cfg.responses, problems, tokenizer, cfg.template, out, cfg.dataset,
                                     cfg.group_by, cfg.grader)
    else:
        dtype = getattr(torch, cfg.dtype) if cfg.dtype else default_dtype(device)
        model_options.check(cfg, checkpoint.read_config(checkpoint.resolve_model_dir(cfg.model)))
        memory.plan_evaluation(cfg, problems, tokenizer, device, dtype)  # prompts and memory that fit, before loading
        net = model_options.load_model(cfg, dtype, device)
        runs.claim(out, "eval", resume=True)  # held until this process ends
        print(f"evaluate.py: {cfg.model} on {cfg.dataset} ({len(problems)} problems), {cfg.max_new_tokens} new tokens, "
              + (f"{cfg.samples} samples at T {cfg.temperature:g}" if cfg.samples > 1 else "greedy")
              + f", grader {cfg.grader}, into {out}", file=sys.stderr)
        _, summary = evaluate(net, tokenizer, problems, cfg.max_new_tokens, cfg.batch_size, cfg.template,
                              cfg.samples, cfg.temperature, cfg.top_p, cfg.seed, out, progress=True,
                              dataset=cfg.dataset, group_by=cfg.group_by, compile=cfg.compile, grader=cfg.grader,
                              dispersion=cfg.dispersion, continuous=cfg.continuous)
    runs.release(out)
    print(format_summary(summary))
    print(f"records: {out / 'records.jsonl'}   summary: {out / 'summary.json'}")
    return summary


if __name__ == "__main__":
    cli.run_main(main, "evaluate.py")
