"""
The embedded tiny world: a synthetic arithmetic task, a character-level tokenizer and a ~0.8M-parameter
Qwen3 pretrained on it, so the whole RLVR loop runs on a laptop CPU in minutes with no download.

    python tiny.py --force       # rebuild data/tiny_*.jsonl (the splits and the ladder) and tiny_model/ from the seed
    python tiny.py --data-only   # only the data files (unchanged ones are rewritten as they are)
    python tiny.py --out runs/tiny_rebuild --data-dir runs/tiny_data   # a new build beside the committed one
    python tiny.py --init tiny --steps 300 --lr 3e-4 --warmup 20 --min-lr-frac 1 \
        --long-4 0.04 --long-5 0.2 --long-6 0.25 --out tiny_ladder_model --force   # the ladder's start (tiny-ladder)

Without --force it refuses, before writing anything, to overwrite a checkpoint in --out or to change a data file.
tiny.py replaces --out whole, so an --out holding anything but a tiny.py checkpoint is refused, --force or not.

The task: 2-3 operations (+, -, *) over integers 1-99 (factors of * are 2-9), applied left to right, with
parentheses where precedence needs them, e.g. `(37 + 12) * 2 - 45`; every intermediate value stays in
0..99; level = number of operations. The worked solution has one line per operation (`37 + 12 = 49`)
and ends in `\\boxed{N}`. The prompt is `problems.format_prompt(problem, "base")`, the same template as
the real task.

The ladder (data/tiny_ladder_{train,val,test}.jsonl, `--dataset tiny_ladder_train`): the same generator at
rungs of 2-6 operations (LADDER_LEVELS; level = operations), from its own random stream, the rungs taking
turns row by row, texts disjoint from each other and from the three splits above. tiny_model/'s pretraining
shows only 2-3 operations, and from it no rung above 3 is ever reached; the ladder starts from tiny-ladder,
which has seen a few thousand longer solutions (--init, below). Guess-proofing: the ladder's grader is
verify.check_steps, which pays only for the problem's own chain (computed from the problem text, parsed, never
evaluated) followed by its box, and it is the ladder's reward and validation rule (--grader steps). Chosen
over a wider answer range because that would also change every step's arithmetic (pretraining on values up to
999 failed, see below), while answers in 0..99 under verify.grade alone pay a guess about 1 time in 100 per
sample, and at rungs 4-6 every right answer of the committed checkpoint is such a guess (research/ladder/ladder.py
reach). Measured there too: SFT on the ladder's solutions reaches 84-98% on every rung, but the committed
checkpoint's exploration never finds a step-valid chain above rung 3 (research/ladder/README.md says why).
The far rungs, questions and answers only, each family from its own stream (FAR_FAMILIES): 7-8 (tiny_ladder_far_*),
9-10 (tiny_ladder_far2_*, added later; a 10-line chain needs FAR2_MAX_NEW_TOKENS = 160) and 11-20 (tiny_ladder_far3_*,
added later still; a 20-line chain needs FAR3_MAX_NEW_TOKENS = 272, so their prompts keep to the 240 tokens of the
512-token context left beside it); each family added left every earlier file byte-identical.

Pretraining plants a cheap habit on purpose: a share of the solutions (most of the 3-operation ones) is a
bare `\\boxed{N}` with no steps. Greedy decoding then answers the long problems directly and is usually
wrong there, and pretraining stops while the model is only "sometimes right", so RL has signal and room:
working step by step pays.

Measured (2 shared CPU cores, 1 thread, torch 2.13): 2,500 steps take 25-28 minutes (1,477 and 1,650 s); the committed
checkpoint has greedy accuracy 42.4% on tiny_test (83.7% on 2 operations, 2.7% on 3), and 57% of its
answers are bare. Two builds from the same code gave byte-identical weights (sha256 1d9ef725...), but the run is chaotic: a
kernel change in model.py that only moved rounding took the 1,500-step build from 35.8% to 26.4% (and
that one was still on the steep part of the curve: validation accuracy 6% at step 1,000, 26% at 1,500),
which is why the default is 2,500 steps, where step-by-step solving is reliable and RL gains are steady.
Tried and dropped: values up to 999 with two-digit factors (2% accuracy after 700 steps of batch 32,
against 7% for 0..99), lr 1e-2 (worse than 3e-3), batches of 16 or 32 (no better per example than 64).
No positional encoding (--rope-theta 1e300, NoPE), tried for the ladder: 29.4% here instead of 42.4%,
and still no step-valid chain above rung 3 (research/ladder/README.md).

--long-4/5/6 mix complete worked solutions of 4-6-operation problems (make_long: their own random stream,
texts outside every split and the ladder) into a share of each batch: the only way found to make a ladder
rung reachable, by construction, since the model gives no probability to a worked line at an index no
example shows (research/ladder/README.md, "Seeded rungs"). The default, 0, draws nothing more: the committed build.

--init CKPT continues a checkpoint (its weights and tokenizer) instead of building one: a mid-training. The
ladder's start, tiny_ladder_model/ (`--model tiny-ladder`), is tiny_model/ continued for 300 steps at lr 3e-4
on its own mix with 4 / 20 / 25% of each batch complete 4 / 5 / 6-operation solutions (768 / 3,840 / 4,800
shown): 4.6 minutes here, byte-identical in three builds. That dose leaves each seeded rung rarer than the one
below it (step-valid per sample 0.056 / 0.013 / 0.0006 at rungs 4 / 5 / 6), so the ladder measures how far a
method takes a skill it finds rarely; tiny_model/ and every number of the main command stay as they were.
"""

import hashlib
import json
import math
import random
import re
import stat
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import checkpoint
import coupled
import model as qwen
import runs
from cli import arg_group, check_fields, parse_config, run_main
from problems import format_prompt
from sample import generate
from verify import check_steps, grade

# -----------------------------------------------------------------------------
# The task: seeded expressions with a structured form (numbers, ops) and their rendered text

CONTEXT = 512  # the tiny models' max_position_embeddings: a prompt and its token budget must fit in it
MAX_VALUE = 99  # every intermediate value stays in 0..99: each step is 1-2 digit arithmetic
LEVELS = (2, 3)  # number of operations
MAX_NEW_TOKENS = 64  # the scripts' generation budget here (--model tiny): a 3-operation solution is ~50 tokens
SPLIT_SIZES = {"test": 500, "val": 500, "train": 20000}  # generated in this order: test never moves
LADDER_LEVELS = (2, 3, 4, 5, 6)  # the ladder's rungs: operations per problem, beyond what pretraining shows
LADDER_MAX_NEW_TOKENS = 128  # a 6-operation solution is ~90 tokens; prompt + budget stay well inside 512
LADDER_SIZES = {"test": 200, "val": 100, "train": 2000}  # problems per rung, generated in this order
FAR_LEVELS = (7, 8)  # rungs no checkpoint was shown a solution of: questions and answers only (tiny_ladder_far_*)
FAR_SIZES = {"test": 200, "val": 100, "train": 1000}  # problems per rung; an 8-line chain is <= 117 tokens: budget 128
FAR2_LEVELS = (9, 10)  # the next far rungs (tiny_ladder_far2_*), added later from their own stream: the files above stay
FAR2_SIZES = {"test": 200, "val": 100, "train": 2000}  # 2,000 fresh problems a rung for System 2 to label
FAR2_MAX_NEW_TOKENS = 160  # a 10-line chain is <= 143 tokens (20,000 drawn); prompt + budget stay well inside 512
FAR3_LEVELS = tuple(range(11, 21))  # rungs 11-20 (tiny_ladder_far3_*), later still, from their own stream
FAR3_SIZES = FAR2_SIZES  # as far2's: 2,000 fresh problems a rung for System 2 to label
FAR3_MAX_NEW_TOKENS = 272  # a 20-line chain, "\n", box, end of text: <= 13 x 20 + 12 tokens, reached in 20,000 drawn
FAR3_MAX_PROMPT = CONTEXT - FAR3_MAX_NEW_TOKENS  # 240: rung 20's prompts over it (<= 247; 1.1% of 20,000) drawn again
FAR_FAMILIES = {  # in the order they were added: each family's texts avoid every split made before it
    "far": dict(levels=FAR_LEVELS, sizes=FAR_SIZES),
    "far2": dict(levels=FAR2_LEVELS, sizes=FAR2_SIZES),
    "far3": dict(levels=FAR3_LEVELS, sizes=FAR3_SIZES, max_prompt=FAR3_MAX_PROMPT),
}


def make_problem(rng, n_ops):
    """A random expression of n_ops operations applied left to right: {numbers, ops, problem, answer, level,
    solution}. Each (operation, operand) is drawn uniformly among those that keep the value in 0..MAX_VALUE."""
    value = rng.randint(1, 99)
    numbers, ops, text, steps = [value], [], str(value), []
    for _ in range(n_ops):
        while True:  # rejection sampling; + or - always has a valid operand, so this ends
            op = rng.choice("+-*")
            b = rng.randint(2, 9) if op == "*" else rng.randint(1, 99)  # one-digit factors
            new = value + b if op == "+" else value - b if op == "-" else value * b
            if 0 <= new <= MAX_VALUE:
                break
        if op == "*" and ops and ops[-1] in "+-":
            text = f"({text})"  # left to right: the sum so far binds before the product
        text = f"{text} {op} {b}"
        steps.append(f"{value} {op} {b} = {new}")
        numbers.append(b)
        ops.append(op)
        value = new
    solution = "\n".join(steps + [f"\\boxed{{{value}}}"])
    return dict(numbers=numbers, ops=ops, problem=text, answer=str(value), level=n_ops, solution=solution)


def make_splits(seed=0, sizes=None):
    """Disjoint splits {name: rows} of distinct problem texts, rows as in data/tiny_*.jsonl."""
    sizes = sizes or SPLIT_SIZES
    rng, seen, pool = random.Random(seed), set(), []
    while len(pool) < sum(sizes.values()):
        p = make_problem(rng, rng.choice(LEVELS))
        if p["problem"] not in seen:
            seen.add(p["problem"])
            pool.append(p)
    splits, start = {}, 0
    for name, n in sizes.items():
        splits[name] = [dict(id=f"tiny_{name}/{i:05d}", source="tiny", problem=p["problem"], answer=p["answer"],
                             level=p["level"], solution=p["solution"]) for i, p in enumerate(pool[start:start + n])]
        start += n
    return splits


def new_problem(rng, n_ops, seen, max_prompt=math.inf):
    """make_problem drawn until its text is not in `seen`, which then holds it, and its prompt (one token a character)
    is at most max_prompt tokens: the context must hold it and the budget of its rung's chain."""
    while True:
        p = make_problem(rng, n_ops)
        if p["problem"] not in seen and len(format_prompt(p["problem"])) <= max_prompt:
            seen.add(p["problem"])
            return p


def make_ladder(seed=0, sizes=None, exclude=(), levels=LADDER_LEVELS, stream=None, max_prompt=math.inf):
    """The ladder's splits {"ladder_" + name: rows}: sizes[name] problems per rung, the rungs taking turns (so
    the first N rows, --num-problems N, are uniform over the rungs), texts distinct across the splits and
    absent from `exclude` (the texts of make_splits). Its own random stream leaves make_splits' as it was."""
    sizes = sizes or LADDER_SIZES
    rng, seen, splits = random.Random(stream or f"ladder-{seed}"), set(exclude), {}
    for name, n in sizes.items():
        rows = []
        while len(rows) < n * len(levels):
            level = levels[len(rows) % len(levels)]
            p = new_problem(rng, level, seen, max_prompt)
            rows.append(dict(id=f"tiny_ladder_{name}/{len(rows):05d}", source="tiny_ladder",
                             problem=p["problem"], answer=p["answer"], level=level, solution=p["solution"]))
        splits["ladder_" + name] = rows
    return splits


def make_far(seed, exclude, family="far"):
    """A far family's splits {f"ladder_{family}_" + name: rows} at its FAR_FAMILIES rungs and sizes, as make_ladder
    builds its own, from the family's own random stream, texts absent from `exclude`. Questions and answers only:
    a policy that solves one has learnt a rung no checkpoint was shown a solution of."""
    rows = make_ladder(seed, exclude=exclude, stream=f"{family}-{seed}", **FAR_FAMILIES[family])
    return {name.replace("ladder_", f"ladder_{family}_"): [
        {**{k: v for k, v in r.items() if k != "solution"}, "source": f"tiny_ladder_{family}",
         "id": r["id"].replace("tiny_ladder_", f"tiny_ladder_{family}_")} for r in split] for name, split in rows.items()}


def problem_texts(splits):
    """Every problem text of {name: rows}: what a split made later must avoid."""
    return {r["problem"] for rows in splits.values() for r in rows}


def make_ladders(seed, exclude):
    """The ladder's splits, then each far family's in the order they were added, every text absent from `exclude` (the
    texts of make_splits) and from the splits before it: a family added later leaves the earlier files as they were."""
    splits = make_ladder(seed, exclude=exclude)
    for family in FAR_FAMILIES:
        splits.update(make_far(seed, set(exclude) | problem_texts(splits), family))
    return splits


def make_long(seed, levels, exclude, n=5000):
    """{level: n rows} of complete worked solutions at rungs pretraining does not otherwise show (--long-4/5/6),
    from their own random stream, texts absent from `exclude` (every split's and the ladder's)."""
    rng, seen = random.Random(f"long-{seed}"), set(exclude)
    return {level: [new_problem(rng, level, seen) for _ in range(n)] for level in levels}


def write_splits(splits, data_dir):
    for name, rows in splits.items():
        with open(Path(data_dir) / f"tiny_{name}.jsonl", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


# -----------------------------------------------------------------------------
# Solutions: what the model learns to write after the prompt


def completion_text(row, bare):
    """The worked solution, or (the cheap habit) the bare boxed answer; the end-of-text token follows."""
    return "\n" + (f"\\boxed{{{row['answer']}}}" if bare else row["solution"])


# -----------------------------------------------------------------------------
# Tokenizer: one token per character, plus <|endoftext|> (which is also the padding)

EOS = "<|endoftext|>"


def build_tokenizer(texts, path):
    """A character-level tokenizer.json over every character in texts; returns model.Tokenizer(path)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    chars = sorted(set("".join(texts)))
    tok = Tokenizer(models.WordLevel({EOS: 0, **{c: i + 1 for i, c in enumerate(chars)}}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")  # every character, newlines too
    tok.decoder = decoders.Fuse()  # join tokens with nothing between them (the default joins with spaces)
    tok.add_special_tokens([EOS])
    tok.save(str(path))
    return checkpoint.Tokenizer(path)


# -----------------------------------------------------------------------------
# Model: a ~0.8M-parameter Qwen3 (the same architecture as the real model, just narrow and shallow)


ROPE_THETA = 10000.0  # the committed build's RoPE base (tiny.py --rope-theta)


def coupling_ids(tokenizer):
    """coupled.coupled_positions' token ids in this tokenizer: the colon, the newline and the ten digits."""
    one = lambda ch: tokenizer.encode(ch)[0]  # one token per character
    return {"colon": one(":"), "newline": one("\n"), "digits": [one(str(d)) for d in range(10)]}


def tiny_config(tokenizer, rope_theta=ROPE_THETA, couple=False):
    shape = dict(vocab_size=64 * math.ceil(tokenizer.vocab_size / 64), hidden_size=128, intermediate_size=384,
                 num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 max_position_embeddings=CONTEXT, rope_theta=rope_theta, tie_word_embeddings=True,
                 bos_token_id=tokenizer.eos_id, eos_token_id=tokenizer.eos_id, torch_dtype="float32")
    if couple:
        return coupled.CoupledQwen3Config(**shape, position_coupling=coupling_ids(tokenizer))
    return qwen.Qwen3Config(**shape)


def new_model(tokenizer, seed, rope_theta=ROPE_THETA, couple=False):
    """A freshly initialized tiny Qwen3 (with --couple, coupled.CoupledQwen3): N(0, 0.02) for every matrix, as
    transformers initializes Qwen3 (initializer_range); norms stay 1. The same seed gives the same weights."""
    torch.manual_seed(seed)
    model = (coupled.CoupledQwen3 if couple else qwen.Qwen3)(tiny_config(tokenizer, rope_theta, couple))
    for p in model.parameters():
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02)
    return model


# -----------------------------------------------------------------------------
# Pretraining: next-token prediction on prompt + solution, loss on the solution tokens only


data_arg, model_arg, pretrain_arg, out_arg = map(arg_group, ('data', 'model', 'pretraining', 'output'))


@dataclass
class TinyConfig:
    HELP_GROUPS = ('data', 'model', 'pretraining', 'output')
    seed: int = data_arg(0, "one seed for the data, the initialization and the data order")
    steps: int = pretrain_arg(2500, "pretraining steps: past the steep part of the curve, step-by-step solving is "
                                    "reliable", range="[1, inf)")
    batch_size: int = pretrain_arg(64, "sequences per step", range="[1, inf)")
    lr: float = pretrain_arg(3e-3, "peak AdamW learning rate", range="(0, inf)")
    warmup: int = pretrain_arg(50, "linear warmup steps, then cosine decay to lr * min_lr_frac", range="[0, inf)")
    min_lr_frac: float = pretrain_arg(0.1, "final learning rate as a fraction of the peak", range="[0, 1]")
    weight_decay: float = pretrain_arg(0.1, "AdamW weight decay on matrices", range="[0, inf)")
    bare_2: float = data_arg(0.3, "share of 2-operation solutions shown as a bare \\boxed{N}", range="[0, 1]")
    bare_3: float = data_arg(0.7, "share of 3-operation solutions shown as a bare \\boxed{N}", range="[0, 1]")
    long_4: float = data_arg(0.0, "share of each batch that is a complete 4-operation solution (a ladder rung made "
                                  "reachable by construction)", range="[0, 1]")
    long_5: float = data_arg(0.0, "the same for 5 operations", range="[0, 1]")
    long_6: float = data_arg(0.0, "the same for 6 operations", range="[0, 1]")
    eval_every: int = pretrain_arg(250, "steps between greedy accuracy checks on the first 200 validation problems",
                                   range="[1, inf)")
    out: str = out_arg("tiny_model", "checkpoint directory to write (relative paths: to the repo)")
    data_dir: str = data_arg("data", "where tiny_{train,val,test}.jsonl are written (relative paths: to the repo)")
    threads: int = pretrain_arg(1, "torch CPU threads (the committed build used 1: fastest on a shared 2-core machine)",
                                range="[1, inf)")
    rope_theta: float = model_arg(ROPE_THETA, "RoPE base; 1e300 leaves only the first rotary pair turning: no "
                                              "positional encoding (NoPE)", range="(0, inf)")
    couple: bool = model_arg(False, "position coupling (coupled.py, Cho et al. 2024): each solution line at the "
                                    "positions of the number it uses; a new model only (--init keeps its own)")
    init: str = model_arg("", "continue this checkpoint (its weights and tokenizer, e.g. tiny) instead of building a "
                              "new model: a mid-training, as tiny_ladder_model/ was made")
    data_only: bool = data_arg(False, "write the data files and stop")
    force: bool = out_arg(False, "overwrite an existing --out checkpoint, or data files that would change (the "
                                 "committed tiny_model/ and data/ took 25 minutes to build)")


PROMPT_HEAD = format_prompt("{problem}").split("{problem}")[0]  # the template text before the problem


class SharedPrefix:
    """Stands in for model.KVCache in pretraining: the template head is the same for every row, so its
    keys and values are computed once per step (batch 1, with gradients) and shared by the batch, which
    then runs only problem + solution: ~3x less compute, and exact (same positions, same attention)."""

    def __init__(self):
        self.k, self.v, self.length = {}, {}, 0
        self.pad, self.head_ids = torch.zeros(1, dtype=torch.long), None  # no padding; the head's tokens

    def positions(self, T):  # (1, T), broadcast over the batch
        return torch.arange(self.length, self.length + T)[None]

    def token_ids(self, input_ids):  # as coupled.CoupledCache.token_ids: each row's tokens so far (head + row)
        if self.length == 0:
            self.head_ids = input_ids
            return input_ids
        return torch.cat([self.head_ids.expand(input_ids.shape[0], -1), input_ids], 1)

    def attention_mask(self, T):  # (1, 1, T, S): causal over head + rows
        q = torch.arange(self.length, self.length + T)[:, None]
        return (torch.arange(self.length + T)[None, :] <= q)[None, None]

    def advance(self, T):  # after a forward, as KVCache
        self.length += T

    def update(self, layer, k, v):
        if self.length == 0:  # the head pass: keep its keys/values
            self.k[layer], self.v[layer] = k, v
            return k, v
        B = k.shape[0]
        return (torch.cat([self.k[layer].expand(B, -1, -1, -1), k], 2),
                torch.cat([self.v[layer].expand(B, -1, -1, -1), v], 2))


def make_batch(tokenizer, rows, bare):
    """The template head (P,), and right-padded (inputs, targets, loss mask), each (B, T), of the rest of
    each sequence: problem + prompt tail + solution + EOS. The mask covers the solution and EOS."""
    head = tokenizer.encode(PROMPT_HEAD)
    seqs, starts = [], []
    for row, b in zip(rows, bare):
        prompt = tokenizer.encode(format_prompt(row["problem"]))
        assert prompt[:len(head)] == head, "format_prompt no longer starts with PROMPT_HEAD"
        seqs.append(prompt[len(head):] + tokenizer.encode(completion_text(row, b)) + [tokenizer.eos_id])
        starts.append(len(prompt) - len(head))
    ids = torch.full((len(seqs), max(map(len, seqs))), tokenizer.pad_id)
    mask = torch.zeros(ids.shape)
    for i, (s, start) in enumerate(zip(seqs, starts)):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, start:len(s)] = 1.0
    return torch.tensor(head), ids[:, :-1], ids[:, 1:], mask[:, 1:]


def forward_shared_head(model, head, inputs):
    """Logits (B, T, vocab) of head + inputs[b] for every row, computing the head once."""
    cache = SharedPrefix()
    model.hidden_states(head[None], cache)
    return model(inputs, cache=cache)


def lr_at(step, cfg):  # linear warmup, then cosine decay (Loshchilov & Hutter 2017) to lr * min_lr_frac
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def long_shares(cfg):
    """{level: share of a batch} for the complete long solutions (--long-4/5/6), the nonzero ones only."""
    return {lv: getattr(cfg, f"long_{lv}") for lv in (4, 5, 6) if getattr(cfg, f"long_{lv}") > 0}


def mix_long(rows, bare, long_rows, shares, gen):
    """Replace each batch row, with probability shares[level], by a complete solution of that level."""
    u = torch.rand(len(rows), generator=gen).tolist()
    pick = torch.randint(1 << 30, (len(rows),), generator=gen).tolist()
    for j, (x, q) in enumerate(zip(u, pick)):
        for level, share in shares.items():
            if x < share:
                rows[j], bare[j] = long_rows[level][q % len(long_rows[level])], False
                break
            x -= share
    return rows, bare


def pretrain(model, tokenizer, train_rows, cfg, val_rows=None, log=print, long_rows=None):
    """Train in place for cfg.steps steps; returns the per-step losses. Deterministic given cfg.seed.
    long_rows ({level: rows}, from make_long) mixes complete long solutions in at long_shares(cfg)."""
    gen = torch.Generator().manual_seed(cfg.seed)  # the data order and the bare/worked draws
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    bare_share = torch.tensor([cfg.bare_2 if r["level"] == 2 else cfg.bare_3 for r in train_rows])
    losses, t0, shares = [], time.time(), long_shares(cfg)
    for step in range(cfg.steps):
        idx = torch.randint(len(train_rows), (cfg.batch_size,), generator=gen)
        bare = (torch.rand(cfg.batch_size, generator=gen) < bare_share[idx]).tolist()
        rows = [train_rows[i] for i in idx]
        if long_rows:  # drawn only then, so a build without long solutions is the committed one, bit for bit
            rows, bare = mix_long(rows, bare, long_rows, shares, gen)
        head, inputs, targets, mask = make_batch(tokenizer, rows, bare)
        model.train()
        logits = forward_shared_head(model, head, inputs)  # (B, T, vocab)
        nll = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)
        loss = (nll * mask).sum() / mask.sum()
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if (step + 1) % 25 == 0 or step == cfg.steps - 1:
            log(f"step {step + 1}/{cfg.steps}  loss {sum(losses[-25:]) / len(losses[-25:]):.4f}  "
                f"lr {lr_at(step, cfg):.2e}  {time.time() - t0:.0f}s")
        if val_rows and cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < cfg.steps:
            m = evaluate(model, tokenizer, val_rows[:200])
            log(f"  val (200): accuracy {m['accuracy']:.3f}  direct-answer share {m['direct_share']:.3f}")
    return losses


# -----------------------------------------------------------------------------
# Evaluation: greedy decoding with the KV cache, graded by verify.grade (the RL reward's grader)

BARE = re.compile(r"\s*\\boxed\{[^{}]*\}\s*")  # a direct answer: nothing but the box


@torch.no_grad()
def greedy_complete(model, tokenizer, problems, max_new_tokens=80):
    """Greedy completions of format_prompt(problem) for each problem, by the project's sampler."""
    model.eval()
    prompts = [tokenizer.encode(format_prompt(p)) for p in problems]
    eos = tokenizer.eos_id
    done = generate(model, prompts, max_new_tokens, temperature=0, stop_token_ids={eos}, pad_id=tokenizer.pad_id)
    return [tokenizer.decode([t for t in c.tokens if t != eos]) for c in done]


def evaluate(model, tokenizer, rows):
    """Greedy accuracy, per level, and the direct-answer share (completions that are a bare box)."""
    completions = greedy_complete(model, tokenizer, [r["problem"] for r in rows])
    correct = [grade(c, r["answer"]) for c, r in zip(completions, rows)]
    metrics = dict(accuracy=sum(correct) / len(rows),
                   direct_share=sum(bool(BARE.fullmatch(c)) for c in completions) / len(rows))
    for level in LEVELS:
        hits = [ok for ok, r in zip(correct, rows) if r["level"] == level]
        metrics[f"accuracy_level{level}"] = sum(hits) / max(1, len(hits))
    return metrics


def evaluate_ladder(model, tokenizer, rows):
    """{rung: greedy step-valid accuracy} (check_steps, the ladder's rule) at the ladder's budget."""
    completions = greedy_complete(model, tokenizer, [r["problem"] for r in rows], LADDER_MAX_NEW_TOKENS)
    correct = [check_steps(c, r["problem"], r["answer"]) for c, r in zip(completions, rows)]
    return {str(lv): sum(ok for ok, r in zip(correct, rows) if r["level"] == lv) / sum(r["level"] == lv for r in rows)
            for lv in sorted({r["level"] for r in rows})}


# -----------------------------------------------------------------------------
# CLI


def check_config(cfg):
    """Refuse settings that cannot run, naming the flag (each flag's own range is on its field)."""
    check_fields(cfg)
    if cfg.init and cfg.rope_theta != ROPE_THETA:
        raise ValueError(f"--rope-theta sets a new model's RoPE base; --init {cfg.init} keeps its own")
    if cfg.init and cfg.couple:
        raise ValueError(f"--couple builds a new model with position coupling; --init {cfg.init} keeps its own")
    if cfg.long_4 + cfg.long_5 + cfg.long_6 > 1:
        raise ValueError(f"--long-4 + --long-5 + --long-6 must be at most 1, got {cfg.long_4 + cfg.long_5 + cfg.long_6}")


TINY_FILES = {"config.json", "model.safetensors", "tokenizer.json", "pretrain.json"}  # what tiny.py writes in --out


def check_out(cfg, out, data_dir):
    """--out must be new, empty, or a tiny.py checkpoint (its files and nothing else; replaced only with --force):
    tiny.py replaces --out whole, so a directory holding anything else (notes, a run, another model) is refused,
    --force or not. A file, a read-only directory, and a --data-dir inside --out are refused too."""
    for flag, path in (("--out", out), ("--data-dir", data_dir)):
        if path.exists() and not path.is_dir():
            raise FileExistsError(f"{flag} {path}: is a file, not a directory; choose another {flag}")
        above = next(p for p in path.parents if p.exists() or p == p.parent)
        if not above.is_dir():
            raise FileExistsError(f"{flag} {path}: {above} is a file, not a directory; choose another {flag}")
    if cfg.data_only:
        return
    if out.is_symlink():
        raise FileExistsError(f"--out {out}: is a symbolic link; tiny.py replaces --out whole, so give the directory "
                              f"itself (or another --out)")
    if data_dir.resolve() == out.resolve() or out.resolve() in data_dir.resolve().parents:
        raise ValueError(f"--data-dir {data_dir} is --out or inside it, and tiny.py replaces --out whole; give "
                         f"another --data-dir")
    names = {p.name for p in out.iterdir()} if out.is_dir() else set()
    if out.is_dir() and not out.stat().st_mode & stat.S_IWUSR:
        raise FileExistsError(f"--out {out}: is read-only; make it writable (chmod u+w) or choose another --out")
    if not names:
        return
    if not (names <= TINY_FILES and {"model.safetensors", "pretrain.json"} <= names):
        what, extra = runs.describe(out) or f"{len(names)} other file(s)", sorted(names - TINY_FILES)
        what += f" ({', '.join(extra[:3])}{' ...' * (len(extra) > 3)})" if extra else " (no pretrain.json)"
        raise FileExistsError(f"--out {out}: holds {what}, not a tiny.py checkpoint ({', '.join(sorted(TINY_FILES))} "
                              f"only); tiny.py replaces --out whole, so it never writes there, --force or not. Choose "
                              f"another --out (an empty or new directory)")
    if not cfg.force:
        raise FileExistsError(f"--out {out}: holds a checkpoint already; pass --force to rebuild it, or give another "
                              f"--out")


def check_overwrites(cfg, out, data_dir, splits):
    """Refuse, before anything is written, an --out that tiny.py may not replace (check_out), or to change data files
    without --force (the data are a function of the seed, so rewriting them unchanged is allowed)."""
    check_out(cfg, out, data_dir)
    if cfg.force:
        return
    for name, rows in splits.items():
        path = data_dir / f"tiny_{name}.jsonl"
        if path.is_file() and path.read_text(encoding="utf-8") != "".join(json.dumps(r) + "\n" for r in rows):
            raise FileExistsError(f"--data-dir {data_dir}: {path.name} holds other problems than --seed {cfg.seed} "
                                  f"makes; pass --force to overwrite it, or give another --data-dir")


def load_init(name):
    """--init's model, tokenizer and the sha256 of its weights, read (and checked) before anything is written: its
    weights hashed as read, before --out (which may be the same directory) is replaced."""
    model = checkpoint.load_model(name, dtype=torch.float32, device="cpu")
    tokenizer = checkpoint.load_tokenizer(name)
    weights = checkpoint.resolve_model_dir(name) / "model.safetensors"
    return model, tokenizer, hashlib.sha256(weights.read_bytes()).hexdigest()


def main(argv=None):
    cfg = parse_config(TinyConfig, argv, __doc__.split("\n\n")[0].strip(), prog="tiny.py")
    check_config(cfg)
    out, data_dir = checkpoint.REPO_DIR / cfg.out, checkpoint.REPO_DIR / cfg.data_dir  # absolute paths stay as given
    splits = make_splits(cfg.seed)
    ladder = make_ladders(cfg.seed, problem_texts(splits))  # the ladder and the far rungs
    check_overwrites(cfg, out, data_dir, {**splits, **ladder})
    init = load_init(cfg.init) if cfg.init and not cfg.data_only else None  # a bad --init fails before any write
    print(json.dumps(asdict(cfg), indent=2))
    torch.set_num_threads(cfg.threads)
    t0 = time.time()
    data_dir.mkdir(parents=True, exist_ok=True)
    write_splits({**splits, **ladder}, data_dir)
    print(f"wrote {', '.join(f'tiny_{k}.jsonl ({len(v)})' for k, v in {**splits, **ladder}.items())} to {data_dir}")
    if cfg.data_only:
        return

    with tempfile.TemporaryDirectory() as tmp:
        init_sha256 = None
        if init:  # a continuation: the checkpoint's weights and tokenizer, this run's mix and schedule
            model, tokenizer, init_sha256 = init
        else:
            texts = [format_prompt("")] + [r["problem"] + r["solution"] for rows in splits.values() for r in rows]
            tokenizer = build_tokenizer(texts, Path(tmp) / "tokenizer.json")
            model = new_model(tokenizer, cfg.seed, cfg.rope_theta, cfg.couple)
        print(f"vocab {tokenizer.vocab_size} (padded to {model.config.vocab_size}), "
              f"{qwen.count_parameters(model.config):,} parameters")
        long_rows = None
        if long_shares(cfg):
            long_rows = make_long(cfg.seed, long_shares(cfg), problem_texts({**splits, **ladder}))
        pretrain(model, tokenizer, splits["train"], cfg, val_rows=splits["val"], long_rows=long_rows)
        checkpoint.save_model(model, out, tokenizer)
    metrics = evaluate(model, tokenizer, splits["test"])
    record = dict(config=asdict(cfg), test=metrics, torch=torch.__version__)  # the weights depend on torch too
    if init_sha256:  # which weights were continued: a changed tiny_model/ means another continuation
        record["init_sha256"] = init_sha256
    if long_shares(cfg):  # the seeded rungs: greedy step-valid accuracy per rung on the ladder's validation split
        record["ladder_val"] = evaluate_ladder(model, tokenizer, ladder["ladder_val"])
    (out / "pretrain.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {out}")
    print(f"test: greedy accuracy {metrics['accuracy']:.3f} (level 2 {metrics['accuracy_level2']:.3f}, "
          f"level 3 {metrics['accuracy_level3']:.3f}), direct-answer share {metrics['direct_share']:.3f}; "
          f"wall time {time.time() - t0:.0f}s")
    if "ladder_val" in record:
        print("ladder_val: greedy step-valid accuracy by rung " + json.dumps(record["ladder_val"]))

if __name__ == "__main__":
    run_main(main, "tiny.py")
