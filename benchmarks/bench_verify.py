"""
Grading throughput of verify.py on the MATH-500 references. Each reference is paired with a correct
answer (restyled the way a model might write it: \\dfrac, spaces, \\left( \\right), `x =`, 42.0) and a
perturbed one (the first number plus one), boxed at the end of a ~1 KB response. Prints grades/s for
plain-number answers (which never reach sympy) and for all answers, pinned to one core, and, when
math_verify is importable, its rate and our agreement with it on the same pairs. Last, the forms of
issue #16 (exact near misses, trig in degrees, repeating decimals, the empty set, scaled matrices).

    python benchmarks/bench_verify.py [--cpu 0] [--repeat 3]
"""

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import symbolic  # noqa: E402
import verify  # noqa: E402

FILLER = 'We expand, simplify and check each case carefully. ' * 20  # ~1 KB of reasoning before the box


def restyle(ans, i):
    """An equivalent way to write ans, as a model might box it instead of the reference string.
    Non-numeric answers get \\sqrt{a} -> (a)^{1/2} and \\frac{a}{b} -> (a)/(b), so they need sympy."""
    if re.fullmatch(r'-?\d+', ans):
        return [f'x = {ans}', f'{ans}.0', f'\\text{{{ans}}}'][i % 3]
    if verify._number(verify.normalize_answer(ans)) is not None:
        return re.sub(r',\\!\s*', ',', ans.replace('\\frac', '\\dfrac'))  # 11,\! 111 -> 11,111
    s = re.sub(r'\\sqrt\{([^{}]*)\}', r'(\1)^{1/2}', ans)
    s = re.sub(r'\\frac\{([^{}]*)\}\{([^{}]*)\}', r'(\1)/(\2)', s)
    return s.replace(',', ', ')


def perturb(ans):
    """A wrong answer: the first run of digits plus one (width kept: .0000672 -> .0000673), else negated."""
    m = re.search(r'\d+', ans)
    if not m:
        return f'-({ans})'
    d = m[0]
    return ans[:m.start()] + str(int(d) + 1).zfill(len(d)) + ans[m.end():]


ISSUE_16 = [  # (answer, reference, equal)
    ('10^{20}+1', '10^{20}', False), ('1+10^{-20}', '1', False), ('\\frac{10^{30}+1}{10^{30}}', '1', False),
    ('\\sqrt{' * 70 + '2' + '}' * 70, '1', False), ('(10^{20}+1)-10^{20}', '1', True),
    ('\\sin 30^\\circ', '\\frac12', True), ('\\tan 60^\\circ', '\\sqrt3', True), ('\\sin 30', '\\frac12', False),
    ('0.\\overline{3}', '\\frac13', True), ('0.1\\overline{6}', '\\frac16', True), ('0.\\overline{3}', '0.3', False),
    ('\\varnothing', '\\emptyset', True), ('\\{\\}', '\\emptyset', True),
    ('-\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}', '\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}', True),
    ('2\\begin{pmatrix}1\\\\3\\end{pmatrix}', '\\begin{pmatrix}2\\\\6\\end{pmatrix}', True),
]


def make_pairs():
    """(response, reference, expected, plain) for every MATH-500 reference, correct and perturbed."""
    pairs = []
    for i, line in enumerate((ROOT / 'data' / 'math500.jsonl').read_text().splitlines()):
        ref = json.loads(line)['answer']
        plain = verify._number(verify.normalize_answer(ref)) is not None
        for ans, expected in ((restyle(ref, i), True), (perturb(ref), False)):
            pairs.append((f'{FILLER}So the answer is $\\boxed{{{ans}}}$.', ref, expected, plain))
    return pairs


def rate(fn, pairs, repeat):
    """(grades per second, verdicts) for fn over pairs, best of repeat runs."""
    best = float('inf')
    for _ in range(repeat):
        start = time.perf_counter()
        verdicts = fn(pairs)
        best = min(best, time.perf_counter() - start)
    return len(pairs) / best, verdicts


def ours(pairs):
    return [verify.grade(x, ref) for x, ref, _, _ in pairs]


def ours_batch(pairs):
    return verify.grade_batch([p[0] for p in pairs], [p[1] for p in pairs])


def theirs(pairs):
    from math_verify import parse, verify as mv_verify
    return [mv_verify(parse(f'\\boxed{{{ref}}}'), parse(x)) for x, ref, _, _ in pairs]


def report(name, pairs, per_s, verdicts):
    right = sum(v == p[2] for v, p in zip(verdicts, pairs))
    ok = sum(v for v, p in zip(verdicts, pairs) if p[2])
    bad = sum(v for v, p in zip(verdicts, pairs) if not p[2])
    n_ok = sum(p[2] for p in pairs)
    print(f'{name:34s} {len(pairs):5d} pairs {per_s:9.0f} grades/s   correct accepted {ok}/{n_ok}, '
          f'perturbed accepted {bad}/{len(pairs) - n_ok}  ({right / len(pairs):.1%} as labelled)')


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--cpu', type=int, default=0, help='core to pin to (the sympy worker inherits it); -1: no pin')
    parser.add_argument('--repeat', type=int, default=3, help='timed runs; the best is reported')
    args = parser.parse_args()
    if args.cpu >= 0:
        os.sched_setaffinity(0, {args.cpu})
    calls = [0]
    ask = symbolic._ask_worker

    def counted(msg, deadline):  # count the comparisons that reach the sympy worker
        calls[0] += 1
        return ask(msg, deadline)
    symbolic._ask_worker = counted
    pairs = make_pairs()
    plain = [p for p in pairs if p[3]]
    start = time.perf_counter()
    verify.is_equivalent('x+1', '1+x')
    print(f'sympy worker start-up (once per process): {time.perf_counter() - start:.2f} s')
    print(f'{sum(p[3] for p in pairs) // 2} of 500 references are plain numbers; '
          f'pinned to cpu {args.cpu}, best of {args.repeat}')
    report('verify.grade, plain numbers', plain, *rate(ours, plain, args.repeat))
    report('verify.grade, symbolic/structured', [p for p in pairs if not p[3]],
           *rate(ours, [p for p in pairs if not p[3]], args.repeat))
    to_sympy = []
    for pair in pairs:  # the pairs whose check needs the sympy worker
        calls[0] = 0
        ours([pair])
        if calls[0]:
            to_sympy.append(pair)
    print(f'{len(to_sympy)} of {len(pairs)} pairs reach the sympy worker')
    report('verify.grade, reaching sympy', to_sympy, *rate(ours, to_sympy, args.repeat))
    per_s, mine = rate(ours, pairs, args.repeat)
    report('verify.grade, all', pairs, per_s, mine)
    report('verify.grade_batch, all', pairs, *rate(ours_batch, pairs, args.repeat))
    for p, v in zip(pairs, mine):
        if v != p[2]:
            print(f'  mislabelled by us: ref {p[1]!r}  answer {verify.extract_answer(p[0])!r}  -> {v}')
    issue = [(f'{FILLER}So the answer is $\\boxed{{{a}}}$.', ref, equal, False) for a, ref, equal in ISSUE_16]
    report('verify.grade, issue #16 forms', issue, *rate(ours, issue, args.repeat))
    try:
        import math_verify  # noqa: F401
    except ImportError:
        print('math_verify is not importable: no comparison')
        return
    report('math_verify, plain numbers', plain, *rate(theirs, plain, 1))
    per_s, mv = rate(theirs, pairs, 1)
    report('math_verify, all', pairs, per_s, mv)
    differ = [(p, a, b) for p, a, b in zip(pairs, mine, mv) if a != b]
    print(f'agreement with math_verify: {1 - len(differ) / len(pairs):.1%} ({len(differ)} pairs differ)')
    for p, a, b in differ:
        print(f'  ref {p[1]!r}  answer {verify.extract_answer(p[0])!r}  ours {a}  math_verify {b}  label {p[2]}')


if __name__ == '__main__':
    main()
