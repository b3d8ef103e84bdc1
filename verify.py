"""
Math answer checking for RL with verifiable rewards: pull the final boxed answer out of a model
response and decide whether it equals the reference answer. A verdict, never a reward: what a rollout
is paid is reward.py's.

The rules, in the order they run (each is a small function below):
 1. Extraction: the content of the last \\boxed{...} (also \\boxed x and \\fbox{...}), braces balanced;
    None when there is none, or when the last one is unbalanced or empty.
 2. Normalization, the same for both sides (MATH-style): drop $, \\left/\\right, \\! \\, \\; spacing,
    degrees (^\\circ), \\% and \\$, units after a number (5 \\text{ cm}^2, 10 dollars), thousands
    separators (11,\\!111), base subscripts (52_8 -> 52), trailing periods; \\dfrac/\\tfrac -> \\frac,
    \\frac12 -> \\frac{1}{2}, \\sqrt2 -> \\sqrt{2}; \\text{...} is unwrapped; (C) -> C. A degree mark in a
    trig function's argument is kept and means pi/180 (\\sin 30^\\circ = 1/2, while \\sin 30 is in
    radians); a repeating decimal is the exact fraction (0.1\\overline{6} -> \\frac{1}{6}); \\varnothing
    and \\{\\} are \\emptyset.
 3. Equal strings are equal; words (east, Evelyn) compare case-insensitively.
 4. Plain numbers (integers, decimals, fractions, mixed numbers, scientific notation) compare in
    Python without sympy: exactly when both are exact; within rel_tol when either is a decimal,
    since a decimal may be rounded, but never beyond half a unit in the last digit of a decimal
    reference (.35626 is not .35625).
 5. Structure: unordered lists (1, -2 = -2, 1) and sets \\{...\\}, with a \\pm b read as two answers;
    unions of intervals (in any order); tuples, points and intervals (ordered, same brackets);
    matrices and vectors (a column vector equals a tuple; a scalar in front multiplies every cell:
    -\\begin{pmatrix}1\\\\2\\end{pmatrix} = (-1, -2)); equations (y = 2x + 3 equals 2x - y + 3 = 0: the
    two sides' differences agree up to a nonzero factor; an `x =` prefix is dropped when only one
    side has it).
 6. Anything else is an expression for symbolic.py: a whitelist LaTeX parser (text outside it
    compares as a string only), a float check at fixed points that rejects, and a sympy worker
    process that proves. Variables are taken to be positive reals (lengths, counts), so sqrt(x^2) = x.
Exact answers are decided exactly. When neither side is written as a decimal (0.333, 3.14, 2e-5;
a plain number in scientific notation, 3\\times10^8, counts as one), the two are equal only when
exactly equal: Fraction arithmetic for plain numbers, a sympy proof for expressions (symbolic.py).
Why: a reward must never pay 10^{20} + 1 for 10^{20}, or 1 + 10^{-20} for 1; a relative tolerance
(rel_tol) is right only for an answer that may itself have been rounded, so only a decimal earns it.
Safety: model output never reaches eval/exec/sympify, and a pathological answer grades as wrong;
it never raises or stalls the caller (symbolic.py bounds sizes and stops a check at its limit).
"""

import re
from fractions import Fraction

import symbolic
from symbolic import ERRORS, MAX_CHARS, check_clock, parse_latex  # ERRORS: every check without a verdict

TIMEOUT = 2.0           # seconds of symbolic work allowed per is_equivalent call
REL_TOL = 1e-4          # relative tolerance when either side has a decimal (maybe rounded) number
MAX_ITEMS = 32          # longest list, tuple or matrix compared element by element

# -----------------------------------------------------------------------------
# extraction

_BOX = re.compile(r'\\(?:boxed|fbox)(?![a-zA-Z])')
_BRACE = re.compile(r'\\.|[{}]', re.S)


def extract_answer(text):
    """Content of the last \\boxed{...} (or \\boxed x, \\fbox{...}) in text, or None if there is none."""
    if not isinstance(text, str):
        return None
    start = None
    for m in _BOX.finditer(text):
        start = m.end()
    if start is None:
        return None
    while text[start:start + 1].isspace():
        start += 1
    if text[start:start + 1] != '{':
        answer = re.split(r'[$\n]', text[start:], maxsplit=1)[0]  # \boxed 5$ ends at $ or the line
    else:
        depth, answer = 0, None
        for m in _BRACE.finditer(text, start):
            if m[0] == '{':
                depth += 1
            elif m[0] == '}':
                depth -= 1
                if depth == 0:
                    answer = text[start + 1:m.start()]
                    break
        if answer is None:  # unbalanced, e.g. a response cut off by the token budget
            return None
    return answer.strip() or None

# -----------------------------------------------------------------------------
# normalization

_UNICODE = [('\u2212', '-'), ('\u00d7', '\\times '), ('\u00b7', '\\cdot '), ('\u00f7', '\\div '),
            ('\u03c0', '\\pi '), ('\u221e', '\\infty '), ('\u221a', '\\sqrt'), ('\u00b0', '^\\circ '),
            ('\u00a0', ' '), ('\u2009', ' '), ('\x00', '')]
_TEXT = r'\\(?:text|textbf|textit|textrm|textnormal|textsf|texttt|mbox|mathrm|mathbf|mathit|mathsf|operatorname)\s*'
_UNIT_TEXT = r'\\(?:text|textrm|textnormal|mbox|mathrm)\s*\{(?:\s+[a-zA-Z]|[a-zA-Z]{2})[a-zA-Z\s.]*\}'  # not \mathrm{i}
_UNITS = ('cm|mm|km|meters?|inch(?:es)?|feet|foot|ft|yards?|miles?|units?|square|sq|degrees?|radians?|'
          'dollars?|cents?|seconds?|minutes?|hours?|days?|weeks?|months?|years?|mph|pounds?|lbs?|'
          'ounces?|grams?|kg|liters?|ml')
_POWER = r'(?:\s*\^\s*\{?\d\}?)?'  # the ^2 of cm^2


_SIMPLE = re.compile(r'[-+]?(?:\d+\.?\d*|\.\d+)')  # 42, -0.5, 5.: no rule below changes them
_DEGREE = re.compile(r'\^\s*\{?\s*\\circ\s*\}?|\\circ(?![a-zA-Z])|\\degree(?![a-zA-Z])')
_TRIG = re.compile(r'\\(?:sin|cos|tan|cot|sec|csc)(?![a-zA-Z])')
_ITEM_END = re.compile(r'[,=&]|\\\\')  # where a list item, equation side or matrix cell ends
_REPEATING = re.compile(r'(?<![\d.])(\d{0,50})\.(\d{0,50})\\(?:overline|bar)(?:\{(\d{1,50})\}|(\d))')  # 0.1\overline{6}


def _degrees(s):
    """Drop degree marks (the question fixes the unit: 30^\\circ is 30), except after a trig function
    in the same list item, where the mark stays as \\degree, which the parser reads as times pi/180:
    \\sin 30^\\circ is 1/2 but \\sin 30 is the sine of 30 radians."""
    def mark(m):
        item = _ITEM_END.split(s[:m.start()])[-1]
        return '\\degree ' if _TRIG.search(item) else ''
    return _DEGREE.sub(mark, s)


def _repeating(m):
    """0.1\\overline{6} -> \\frac{1}{6}: a repeating decimal is an exact fraction, not a rounded decimal."""
    whole, head, cycle = m[1] or '0', m[2], m[3] or m[4]
    value = int(whole) + Fraction(int(head + cycle) - int(head or '0'), 10 ** len(head) * (10 ** len(cycle) - 1))
    return f'\\frac{{{value.numerator}}}{{{value.denominator}}}'


def normalize_answer(s):
    """MATH-style canonical form of an answer string (pred and ref get the same treatment)."""
    s = s.strip()
    if _SIMPLE.fullmatch(s):  # most answers are plain numbers: no need for the two dozen regexes
        return s.rstrip('.')
    return _normalize_latex(s)


def _normalize_latex(s):
    """normalize_answer past plain numbers: units, text, spacing and LaTeX spellings of one value made one."""
    for a, b in _UNICODE:
        s = s.replace(a, b)
    s = s.replace('\\$', '').replace('$', '').replace('~', ' ').replace('{,}', ',')
    s = re.sub(r'(?<=\d),\\!\s*(?=\d)', ',', s)  # 11,\! 111: a thousands separator, not a list
    s = re.sub(r'\\(?:displaystyle|textstyle|left\.|right\.|q?quad(?![a-zA-Z]))|(?<!\\)\\[!,;:> ]', ' ', s)
    s = re.sub(r'\\(?:left|right|[bB]igg?[lr]?)(?![a-zA-Z])', '', s)
    s = re.sub(r'\\[dtc]frac(?![a-zA-Z])', r'\\frac', s)
    s = _degrees(re.sub(r'\\%|%', '', s))
    s = s.replace('\\mathbb{R}', '(-\\infty,\\infty)')
    s = re.sub(_TEXT + r'\{\s*(?:and|or)\s*\}|\s+(?:and|or)\s+', ',', s)  # "1 and 2" is the list 1, 2
    s = re.sub(r'(?<=[\d}.)])\s*' + _UNIT_TEXT + _POWER, '', s)         # 5.4 \text{ cents}
    for _ in range(3):                                                   # \text{\textbf{C}}
        s = re.sub(_TEXT + r'\{([^{}]*)\}', r'\1', s)
    s = re.sub(r'(?<=[\d}])\s*(?:(?:' + _UNITS + r')(?![a-zA-Z])\s*)+' + _POWER + '$', '', s)
    s = re.sub(r'\\sqrt\s*(\w)', r'\\sqrt{\1}', s)
    s = re.sub(r'\\frac\s*(\w)\s*(\w)', r'\\frac{\1}{\2}', s)
    s = re.sub(r'\\frac\s*(\w)\s*\{', r'\\frac{\1}{', s)
    s = re.sub(r'\\frac\s*(\{[^{}]*\})\s*(\w)', r'\\frac\1{\2}', s)
    if re.fullmatch(r'\s*[-+]?\d{1,3}(?:,\d{3})+(?:\.\d*)?\s*', s):  # 11,111,100 but not the list 58, 500
        s = s.replace(',', '')
    s = re.sub(r'(\\[a-zA-Z]+|(?<![\\a-zA-Z])[a-zA-Z])\s+(?=[a-zA-Z])', '\\1\x00', s)  # \cot x, L C s
    s = re.sub(r'\s+', '', s).replace('\x00', ' ')
    s = _REPEATING.sub(_repeating, s)
    s = re.sub(r'\\varnothing(?![a-zA-Z])|\\\{\\\}', r'\\emptyset', s)  # one name for the empty set
    s = s.rstrip('.')
    s = re.sub(r'^[a-zA-Z]\\in(?![a-zA-Z])', '', s)                # x \in [-2, 7]
    s = re.sub(r'^(\d+)_\{?\d+\}?$', r'\1', s)  # 52_8 -> 52: the problem fixes the base
    s = re.sub(r'^\(([A-Za-z])\)$', r'\1', s)   # (C) -> C
    return s

# -----------------------------------------------------------------------------
# plain numbers: no sympy

_DEC = r'[-+]?(?:\d+\.?\d*|\.\d+)'
_SCI = re.compile(rf'({_DEC})(?:[eE]([-+]?\d+)|(?:\\times|\\cdot|\*)10\^\{{?([-+]?\d+)\}}?)?')
_FRAC = re.compile(rf'([-+]?)\\frac\{{({_DEC})\}}\{{({_DEC})\}}|({_DEC})/({_DEC})')
_MIXED = re.compile(r'([-+]?)(\d+)\\frac\{(\d+)\}\{(\d+)\}')  # 1\frac{4}{5} is 9/5 in MATH


def _number(s):
    """(value, slack) for a plain number, else None. slack is 0 for an exact number, half a unit in
    the last digit for a decimal (it may be rounded), and None when unknown (\\frac{1.5}{2})."""
    m = _SCI.fullmatch(s)
    if not m:
        return _fraction(s)
    exp = int(m[2] or m[3] or 0)
    if abs(exp) > 400:
        return None
    value = Fraction(m[1]) if '.' in m[1] else Fraction(int(m[1]))  # int(): no string parsing in Fraction
    if exp:
        value *= Fraction(10) ** exp
    if s.lstrip('-+').isdigit():
        return value, 0
    places = len(m[1].partition('.')[2])
    return value, Fraction(10) ** (exp - places) / 2


def _fraction(s):
    """_number of a fraction (\\frac{a}{b}, a/b) or a mixed number (2\\frac{1}{3}), else None."""
    m = _FRAC.fullmatch(s)
    if m:
        num, den = _number(m[2] or m[4]), _number(m[3] or m[5])
        if num is None or den is None or den[0] == 0:
            return None
        return (-1 if m[1] == '-' else 1) * num[0] / den[0], 0 if num[1] == den[1] == 0 else None
    m = _MIXED.fullmatch(s)
    if m and int(m[4]):
        return (-1 if m[1] == '-' else 1) * (int(m[2]) + Fraction(int(m[3]), int(m[4]))), 0
    return None


def _numbers_equal(a, b, rel_tol):
    """Exact numbers must be equal; otherwise within rel_tol of the reference b, and, when b is a
    decimal, within half a unit of its last digit (.35626 is not .35625)."""
    (x, x_slack), (y, y_slack) = a, b
    if x == y or x_slack == y_slack == 0:
        return x == y
    tol = Fraction(rel_tol) * abs(y)
    return abs(x - y) <= (tol if not y_slack else min(tol, y_slack))


# -----------------------------------------------------------------------------
# structured answers: lists, sets, \pm, unions, equations, tuples, intervals, matrices

_MATRIX = re.compile(r'(.*?)(?:\\cdot|\\times|\*)?\\begin\{([pbB]?matrix|array)\}(?:\{[lcr|]*\})?(.*)\\end\{\2\}', re.S)
_LHS = re.compile(r'[a-zA-Z](?:_\{?\w+\}?)?(?:\([a-z]\))?')  # x =, a_1 =, f(x) =
_WORD = re.compile(r'(?=.*[A-Za-z]{3})[A-Za-z ]+')  # east, Evelyn, no solution


def _split_top(s, sep):
    """Split s at sep where no bracket is open; any bracket kind counts, so [a, b) works."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(s):
        c = s[i]
        if c in '([{':
            depth += 1
        elif c in ')]}':
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            i = start = i + len(sep)
            continue
        i += 1
    return parts + [s[start:]]


def _wrapped(s):
    """True when the bracket opening s closes at its last character: (a, b] but not (a)(b)."""
    depth = 0
    for i, c in enumerate(s):
        depth += (c in '([{') - (c in ')]}')
        if depth <= 0:
            return i == len(s) - 1
    return False


def _expand_pm(s):
    """'1\\pm\\sqrt5' -> ['1+\\sqrt5', '1-\\sqrt5']; at most three \\pm signs."""
    m = re.search(r'\\(pm|mp)(?![a-zA-Z])', s)
    if not m or len(re.findall(r'\\(?:pm|mp)(?![a-zA-Z])', s)) > 3:
        return [s]
    first, second = ('+', '-') if m[1] == 'pm' else ('-', '+')
    head, tail = s[:m.start()], s[m.end():]
    return _expand_pm(head + first + tail) + _expand_pm(head + second + tail)


def _items(s):
    """The answers of a list or set: '\\{1\\pm\\sqrt5, -2\\}' -> three items."""
    if s.startswith('\\{') and s.endswith('\\}') and _wrapped(s[1:]):
        s = s[2:-2]
    return [x for part in _split_top(s, ',') for x in _expand_pm(part)]


def _equation(s):
    """(lhs, rhs) of 'lhs = rhs' with a single '=', else None."""
    parts = _split_top(s, '=')
    if len(parts) == 2 and all(parts) and not parts[0].endswith(('<', '>', '!')):
        return parts
    return None


def _scaled(k, cell):
    """The cell k * cell as an answer string: exact numbers are multiplied here, anything else is
    left to the parser as the product (k)(cell)."""
    a, b = _number(k), _number(cell)
    if a and b and a[1] == b[1] == 0:
        return str(a[0] * b[0])  # '-1', '3/2': plain numbers again
    return f'({k})({cell})'


def _matrix(s):
    """Rows of cells of a pmatrix/bmatrix/array, or None; a scalar in front multiplies every cell:
    -\\begin{pmatrix}1\\\\3\\end{pmatrix} has the cells -1 and -3."""
    m = '\\begin' in s and _MATRIX.fullmatch(s)  # the 'in' test spares most answers the regex
    if not m:
        return None
    k = {'': None, '+': None, '-': '-1'}.get(m[1], m[1])
    if k is not None and _number(k) is None and parse_latex(k) is None:
        return None  # not a scalar we can read
    rows = [r.split('&') for r in m[3].split('\\\\')]
    rows = rows[:-1] if len(rows) > 1 and rows[-1] == [''] else rows  # a trailing \\
    return rows if k is None else [[_scaled(k, c) for c in r] for r in rows]


def _tuple(s):
    """(open, close, items) for (a, b), [a, b), and row/column vectors (as '(', ')'), else None."""
    rows = _matrix(s)
    if rows is not None:
        if len(rows) == 1 or all(len(r) == 1 for r in rows):
            return '(', ')', [c for r in rows for c in r]
        return None
    if len(s) > 2 and s[0] in '([' and s[-1] in ')]' and _wrapped(s):
        items = _split_top(s[1:-1], ',')
        if len(items) > 1:
            return s[0], s[-1], items
    return None


def _matched(ps, rs, same, ordered):
    """Element-wise match; an unordered list pairs each element with any unused equal one."""
    if len(ps) != len(rs) or len(ps) > MAX_ITEMS:
        return False
    if ordered:
        return all(same(a, b) for a, b in zip(ps, rs))
    left = list(rs)
    for a in ps:
        j = next((j for j, b in enumerate(left) if a == b), None)  # cheap exact pass first
        if j is None:
            j = next((j for j, b in enumerate(left) if same(a, b)), None)
        if j is None:
            return False
        del left[j]
    return True


def _equiv(p, r, rel_tol, deadline, depth=0):
    """Equivalence of two normalized answers: rules 3-6 of the module docstring."""
    if p == r:
        return True
    if not p or not r or depth > 4 or check_clock() > deadline:
        return False
    if _WORD.fullmatch(p) and _WORD.fullmatch(r):
        return p.lower() == r.lower()
    a, b = _number(p), _number(r)
    if a and b:  # before the structure rules: a plain number is never a list, tuple or equation
        return _numbers_equal(a, b, rel_tol)
    return _equiv_structures(p, r, rel_tol, deadline, depth)


def _equiv_structures(p, r, rel_tol, deadline, depth):
    """_equiv past plain numbers: lists, unions, equations, tuples, matrices, then sympy (rules 4-6)."""
    def same(a, b):
        return _equiv(a, b, rel_tol, deadline, depth + 1)
    ps, rs = _items(p), _items(r)
    if len(ps) > 1 or len(rs) > 1:
        return _matched(ps, rs, same, ordered=False)
    p, r = ps[0], rs[0]
    ps, rs = _split_top(p, '\\cup'), _split_top(r, '\\cup')
    if len(ps) > 1 or len(rs) > 1:
        return _matched(ps, rs, same, ordered=False)
    pe, re_ = _equation(p), _equation(r)
    if pe and re_:
        if pe[0] == re_[0]:
            return same(pe[1], re_[1])
        return symbolic.equal('eq', f'({pe[0]})-({pe[1]})', f'({re_[0]})-({re_[1]})', rel_tol, deadline)
    if pe:
        return bool(_LHS.fullmatch(pe[0])) and same(pe[1], r)
    if re_:
        return bool(_LHS.fullmatch(re_[0])) and same(p, re_[1])
    pt, rt = _tuple(p), _tuple(r)
    if pt or rt:
        return bool(pt and rt) and pt[:2] == rt[:2] and _matched(pt[2], rt[2], same, ordered=True)
    pm, rm = _matrix(p), _matrix(r)
    if pm or rm:
        return (bool(pm and rm) and [len(x) for x in pm] == [len(x) for x in rm]
                and _matched(sum(pm, []), sum(rm, []), same, ordered=True))
    a, b = _number(p), _number(r)
    if a and b:  # \\{5\\} is 5 once unwrapped
        return _numbers_equal(a, b, rel_tol)
    return symbolic.equal('expr', p, r, rel_tol, deadline)

# -----------------------------------------------------------------------------
# public API: equivalence, grade, and its batch form


def is_equivalent(pred, ref, rel_tol=REL_TOL, timeout=TIMEOUT):
    """True when answer pred equals reference answer ref (rules in the module docstring)."""
    try:
        if not isinstance(pred, str) or not isinstance(ref, str):
            return False
        if len(pred) > MAX_CHARS or len(ref) > MAX_CHARS:
            return pred.strip() == ref.strip()
        return _equiv(normalize_answer(pred), normalize_answer(ref), rel_tol, check_clock() + timeout)
    except Exception:  # a rule tripping on odd input grades it wrong instead of crashing a training run
        ERRORS['rule'] += 1
        return False


def grade(response, ref, rel_tol=REL_TOL, timeout=TIMEOUT):
    """True when the last boxed answer of a model response equals the reference answer."""
    pred = extract_answer(response)
    return pred is not None and is_equivalent(pred, ref, rel_tol, timeout)


def grade_batch(responses, refs, rel_tol=REL_TOL, timeout=TIMEOUT):
    """[grade(x, ref) for each pair], checking repeated (answer, reference) pairs once."""
    verdicts, out = {}, []  # a GRPO group often repeats an answer: check each distinct pair once
    for pred, ref in zip((extract_answer(x) for x in responses), refs, strict=True):
        if (pred, ref) not in verdicts:
            verdicts[pred, ref] = pred is not None and is_equivalent(pred, ref, rel_tol, timeout)
        out.append(verdicts[pred, ref])
    return out


# -----------------------------------------------------------------------------
# Graders: the rule the RL reward and evaluation share (train_rl.py --grader, evaluate.py --grader)

GRADERS = ("answer", "steps")  # the final answer (grade), or the tiny ladder's worked lines too (check_steps)
NUMBER_OR_OP = re.compile(r"\d+|(?<= )[+*-](?= )")  # operators stand between spaces in tiny.make_problem's text


def operations(problem):
    """(first number, [(operator, number), ...]) of a tiny-world expression, read left to right as tiny.make_problem
    builds it (its brackets only ever say so); ValueError for any other text."""
    tokens = NUMBER_OR_OP.findall(problem)
    alternate = [t.isdigit() for t in tokens] == [i % 2 == 0 for i in range(len(tokens))]  # number op number ...
    every_op = len(re.findall(r"[+*-]", problem)) == len(tokens) // 2  # each operator read: '1 + 2 *' is no chain
    if not (re.fullmatch(r"[\d+*() -]+", problem) and len(tokens) >= 3 and len(tokens) % 2 and alternate and every_op):
        raise ValueError(f"--grader steps grades the tiny world's expressions only, not {problem[:40]!r}")
    return int(tokens[0]), [(op, int(b)) for op, b in zip(tokens[1::2], tokens[2::2])]


def chain(problem):
    """(worked lines, final value) of a tiny-world expression, parsed (never evaluated) and computed left to right."""
    value, steps = operations(problem)
    lines = []
    for op, b in steps:
        new = value + b if op == "+" else value - b if op == "-" else value * b
        lines.append(f"{value} {op} {b} = {new}")
        value = new
    return lines, value


def check_steps(response, problem, answer):
    """True when the response is the problem's worked solution: its non-empty lines, spaces aside, are the
    chain's lines in order and then \\boxed{answer}, and nothing else. A bare or lucky answer fails."""
    lines, value = chain(problem)
    want = [line.replace(" ", "") for line in lines] + [f"\\boxed{{{value}}}"]
    got = ["".join(line.split()) for line in response.strip().splitlines() if line.strip()]
    return got == want and str(value) == str(answer).strip()


STEP_LINE = re.compile(r"(\d+) ([+*-]) (\d+) = (\d+)")  # one worked line: a op b = c


def first_error(response, problem):
    """(line index, kind) of the first worked line that leaves the problem's chain: 'stopped' (boxed too
    early), 'carry' (not the previous result), 'operand' (wrong operator or number copied from the problem),
    'arithmetic' (right operands, wrong result), 'malformed', 'short' (no more lines), or 'tail' (the lines
    are right; the box or what follows is not)."""
    lines, _ = chain(problem)
    got = [line.strip() for line in response.strip().splitlines() if line.strip()]
    for i, want in enumerate(lines):
        if i >= len(got):
            return i, "short"
        if got[i] == want:
            continue
        if got[i].startswith("\\boxed"):
            return i, "stopped"
        m, w = STEP_LINE.fullmatch(got[i]), STEP_LINE.fullmatch(want)
        if not m:
            return i, "malformed"
        if m[1] != w[1]:
            return i, "carry"
        return (i, "operand") if m.group(2, 3) != w.group(2, 3) else (i, "arithmetic")
    return len(lines), "tail"


def grade_with(grader, responses, problems):
    """The verdicts (bools) on responses to problems (dicts with 'problem' and 'answer') under a grader (GRADERS):
    'answer' checks the final answer (grade_batch), 'steps' (the tiny ladder's) the problem's own worked chain
    too, so a guessed answer fails."""
    if grader == "steps":
        return [check_steps(r, p["problem"], p["answer"]) for r, p in zip(responses, problems, strict=True)]
    return grade_batch(responses, [p["answer"] for p in problems])
