"""
Math answer checking for RL with verifiable rewards: pull the final boxed answer out of a model
response, decide whether it equals the reference answer, and turn that into a reward.

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
 6. Anything else is parsed by a small whitelist LaTeX parser (numbers, one-letter and Greek
    variables, + - * / ^, implicit products, \\frac, \\sqrt[n], \\pi, e, i, \\infty, trig and log
    functions, !, |x|, floor/ceil, \\binom); text outside the whitelist compares as a string only.
    A float evaluation at fixed points rejects clearly different pairs at once; the rest go to a
    sympy worker process that evaluates both at those points with 50 digits, which also only
    rejects, unless a side is a decimal. Variables are taken to be positive reals (lengths, counts),
    so sqrt(x^2) = x.
Exact answers are decided exactly. When neither side is written as a decimal (0.333, 3.14, 2e-5;
a plain number in scientific notation, 3\\times10^8, counts as one), the two are equal only when
exactly equal: Fraction arithmetic for plain numbers; in sympy, a proof (rational arithmetic,
expand, simplify, a minimal polynomial for algebraic numbers, and, with variables, an exact zero
of the difference at each fixed point). Why: a reward must never pay 10^{20} + 1 for 10^{20}, or
1 + 10^{-20} for 1; a relative tolerance (rel_tol) is right only for an answer that may itself
have been rounded, so only a decimal earns it.
Safety: model output never reaches eval/exec/sympify; sympy objects are built from our own parse.
Sizes are bounded before sympy evaluates (answer length, exponents, factorials), and all sympy
work runs in a persistent worker process that is killed and restarted when a check passes its time
limit. A pathological answer grades as wrong; it never raises or stalls the caller.
"""

import atexit
import cmath
import collections
import json
import math
import operator
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import zlib
from fractions import Fraction

TIMEOUT = 2.0           # seconds of symbolic work allowed per is_equivalent call
REL_TOL = 1e-4          # relative tolerance when either side has a decimal (maybe rounded) number
MAX_CHARS = 1000        # longer answers compare as strings only (reference answers are < 250 chars)
MAX_DIGITS = 10_000     # refuse powers whose value would need more digits (9^{9^{9^9}})
MAX_FACTORIAL = 1000    # refuse n! above this n ((10^{10^{10}})!)
MAX_ITEMS = 32          # longest list, tuple or matrix compared element by element
STARTUP_TIMEOUT = 60.0  # the worker's one-off sympy import; not counted against a check's limit
WORKER_MEMORY = 4 << 30  # address-space cap of the worker, so a huge computation fails instead of swapping

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
    if _SIMPLE.fullmatch(s):  # most answers are plain numbers: skip the two dozen regexes below
        return s.rstrip('.')
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
    if m:
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
        return _symbolic('eq', f'({pe[0]})-({pe[1]})', f'({re_[0]})-({re_[1]})', rel_tol, deadline)
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
    return _symbolic('expr', p, r, rel_tol, deadline)

# -----------------------------------------------------------------------------
# safe LaTeX parser: a whitelist of tokens to a tuple AST; nothing is ever evaluated as code

_TOKEN = re.compile(r'\s*(\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\\[a-zA-Z]+|\S)')
_GREEK = set('alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi '
             'rho sigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Sigma Phi Psi Omega'.split())
_FUNCS = set('sin cos tan cot sec csc arcsin arccos arctan sinh cosh tanh log ln exp'.split())
_ATOMS = _GREEK | _FUNCS | {'frac', 'sqrt', 'binom', 'pi', 'infty', 'lfloor', 'lceil'}
_LETTERS = set('abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ')
_DEGREE_NODE = ('div', ('const', 'pi'), ('num', '180'))
_TEXTLIKE = re.compile(r'(?<![\\a-zA-Z])(?<!_\{)[a-zA-Z]{3,}')  # a word, not a product of three variables


class _Parser:
    """Recursive descent, lowest precedence first: expr (+ -) > term (* / implicit) > unary > power > atom."""

    def __init__(self, s):
        self.toks, self.i, self.in_abs = _TOKEN.findall(s), 0, 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else ''

    def take(self, want=None):
        t = self.peek()
        if not t or want is not None and t != want:
            raise ValueError(f'expected {want or "more"}, got {t!r}')
        self.i += 1
        return t

    def starts_atom(self, t):
        return (t[:1].isdigit() or t[:1] == '.' and len(t) > 1 or t in _LETTERS or t in ('(', '[', '{')
                or t == '|' and not self.in_abs or t[:1] == '\\' and t[1:] in _ATOMS)

    def expr(self):
        node = self.term()
        while self.peek() in ('+', '-'):
            sign, rhs = self.take(), self.term()
            node = ('add', node, rhs if sign == '+' else ('neg', rhs))
        return node

    def term(self):
        node = self.unary()
        while True:
            t = self.peek()
            if t in ('*', '\\cdot', '\\times', '/', '\\div'):
                self.take()
                node = ('div' if t in ('/', '\\div') else 'mul', node, self.unary())
            elif self.starts_atom(t):  # implicit product: 2x, 3\sqrt{2}, (a+5)(b+2)
                node = ('mul', node, self.power())
            else:
                return node

    def unary(self):
        if self.peek() in ('-', '+'):
            sign, node = self.take(), self.unary()
            return ('neg', node) if sign == '-' else node
        return self.power()

    def power(self):
        node = self.atom()
        while self.peek() == '!':
            self.take()
            node = ('fact', node)
        if self.peek() == '^':
            self.take()
            node = ('pow', node, self.script())
        if self.peek() == '\\degree':  # 30\degree, 10^2\degree: kept only in a trig argument (_degrees)
            self.take()
            node = ('mul', node, _DEGREE_NODE)
        return node

    def script(self):
        """The argument of ^: {group}, or one token with an optional sign (x^-1)."""
        if self.peek() in ('-', '+'):
            sign, node = self.take(), self.script()
            return ('neg', node) if sign == '-' else node
        return self.arg()

    def arg(self):
        """A macro argument: a {group} or a single token; \\frac12 reads 1 then 2."""
        t = self.peek()
        if t[:1].isdigit() and len(t) > 1:
            self.toks[self.i] = t[1:]
            return ('num', t[0])
        return self.atom()

    def name(self, base):
        """A variable name with its subscript: x, x_1, a_{n}, theta."""
        if self.peek() != '_':
            return base
        self.take()
        if self.peek() != '{':
            return f'{base}_{self.take()}'
        self.take('{')
        sub = []
        while self.peek() != '}':
            sub.append(self.take())
        self.take('}')
        return f'{base}_{"".join(sub)}'

    def atom(self):
        t = self.take()
        if t[0].isdigit() or t[0] == '.' and len(t) > 1:
            return ('num', t)
        if t in _LETTERS:
            name = self.name(t)
            return ('const', name) if name in ('e', 'i') else ('sym', name)
        if t in ('(', '[', '{'):
            node = self.expr()
            self.take({'(': ')', '[': ']', '{': '}'}[t])
            return node
        if t == '|':
            self.in_abs += 1
            node = self.expr()
            self.take('|')
            self.in_abs -= 1
            return ('abs', node)
        cmd = t[1:] if t[0] == '\\' else None
        if cmd == 'frac':
            return ('div', self.arg(), self.arg())
        if cmd == 'binom':
            return ('binom', self.arg(), self.arg())
        if cmd == 'sqrt':
            index = ('num', '2')
            if self.peek() == '[':
                self.take()
                index = self.expr()
                self.take(']')
            return ('root', self.arg(), index)
        if cmd in ('pi', 'infty'):
            return ('const', 'oo' if cmd == 'infty' else 'pi')
        if cmd in _GREEK:
            return ('sym', self.name(cmd))
        if cmd in ('lfloor', 'lceil'):
            node = self.expr()
            self.take('\\r' + cmd[1:])
            return (cmd[1:], node)
        if cmd in _FUNCS:
            return self.func(cmd)
        raise ValueError(f'{t!r} is outside the whitelist')

    def func(self, name):
        """\\sin x, \\sin(x), \\sin^2 x, \\log_2 8, \\sin 2x (the argument runs until an operator)."""
        base = power = None
        if name == 'log' and self.peek() == '_':
            self.take()
            base = self.arg()
        if self.peek() == '^':
            self.take()
            power = self.script()
        if self.peek() == '(':
            x = self.atom()
        else:
            x = self.power()
            while self.starts_atom(self.peek()) and self.peek()[1:] not in _FUNCS:
                x = ('mul', x, self.power())
        node = ('func', name, x, base)
        return ('pow', node, power) if power else node


def parse_latex(s):
    """AST of a whitelisted LaTeX expression, or None (the answer then compares as a string only)."""
    if len(s) > MAX_CHARS or _TEXTLIKE.search(s):
        return None
    try:
        parser = _Parser(s)
        node = parser.expr()
        return node if parser.i == len(parser.toks) else None
    except (ValueError, IndexError, RecursionError):
        return None

# -----------------------------------------------------------------------------
# evaluation: floats at fixed points here, sympy in the worker


def _point(name, trial):
    """The value a variable takes in a numeric trial: deterministic across processes, in [0.2, 0.95]."""
    return Fraction(200 + zlib.crc32(f'{name}/{trial}'.encode()) % 751, 1000)


_CMATH = {'sin': cmath.sin, 'cos': cmath.cos, 'tan': cmath.tan, 'cot': lambda z: 1 / cmath.tan(z),
          'sec': lambda z: 1 / cmath.cos(z), 'csc': lambda z: 1 / cmath.sin(z), 'arcsin': cmath.asin,
          'arccos': cmath.acos, 'arctan': cmath.atan, 'sinh': cmath.sinh, 'cosh': cmath.cosh,
          'tanh': cmath.tanh, 'log': cmath.log, 'ln': cmath.log, 'exp': cmath.exp}


def _real(z):
    if abs(z.imag) > 1e-12 * max(1.0, abs(z.real)):
        raise ValueError('needs a real argument')
    return z.real


_ARITH = {'add': operator.add, 'neg': operator.neg, 'mul': operator.mul, 'div': operator.truediv, 'pow': operator.pow}


def _approx(node, trial, sizes):
    """Complex float value of an AST, with every intermediate |value| appended to sizes; raises
    (overflow, pole, infinity) when it cannot tell."""
    kind, args = node[0], node[1:]
    if kind == 'num':
        z = complex(float(args[0]))
    elif kind == 'sym':
        z = complex(_point(args[0], trial))
    elif kind == 'const':
        z = {'e': complex(math.e), 'i': 1j, 'pi': complex(math.pi)}[args[0]]  # KeyError for oo
    elif kind == 'func':
        z = _CMATH[args[0]](_approx(args[1], trial, sizes))
        if args[2] is not None:
            z /= cmath.log(_approx(args[2], trial, sizes))
    else:
        x = [_approx(a, trial, sizes) for a in args]
        if kind in _ARITH:
            z = _ARITH[kind](*x)
        elif kind == 'root':  # the real root for an odd index: \sqrt[3]{-8} = -2
            odd = x[1].imag == 0 and x[1].real % 2 == 1
            z = -(-x[0]) ** (1 / x[1]) if odd and x[0].imag == 0 and x[0].real < 0 else x[0] ** (1 / x[1])
        elif kind == 'fact':
            z = complex(math.gamma(_real(x[0]) + 1))
        elif kind == 'binom':
            n, k = _real(x[0]), _real(x[1])
            z = complex(math.gamma(n + 1) / math.gamma(k + 1) / math.gamma(n - k + 1))
        elif kind == 'abs':
            z = complex(abs(x[0]))
        else:  # floor, ceil
            z = complex((math.floor if kind == 'floor' else math.ceil)(_real(x[0])))
    if not (math.isfinite(z.real) and math.isfinite(z.imag)):
        raise OverflowError('not finite')
    sizes.append(abs(z))
    return z + 0j  # turns an imaginary part of -0.0 into 0.0, which sits on the principal side of branch cuts


def _clearly_differ(a, b, rel_tol):
    """True when a float evaluation shows the ASTs differ: most wrong answers never reach sympy."""
    tol = max(1e-3, 10 * rel_tol)  # loose: float round-off must never reject an equal pair
    for trial in range(3):
        sizes = []  # round-off scales with the largest intermediate: (10^{20}+1)-10^{20} is 1
        try:
            x, y = _approx(a, trial, sizes), _approx(b, trial, sizes)
        except (ArithmeticError, ValueError, KeyError, TypeError, RecursionError):
            continue
        if abs(x - y) > tol * max(sizes) + 1e-9:
            return True
    return False


def _inexact(s):
    return re.search(r'\d\.|\.\d|\d[eE][-+]?\d', s) is not None


def _symbolic(kind, p, r, rel_tol, deadline):
    """Compare whitelisted expressions: float pre-check here, then sympy in the worker."""
    a, b = parse_latex(p), parse_latex(r)
    if a is None or b is None:
        return False  # outside the whitelist: the strings already differed
    if kind == 'expr' and _clearly_differ(a, b, rel_tol if _inexact(p) or _inexact(r) else 0.0):
        return False
    return _ask_worker([kind, p, r, rel_tol], deadline)


def _check_size(base, exp, limit):
    """Raise when base**exp would need more than limit digits, before sympy computes it."""
    import sympy
    if not exp.is_number:
        return
    e = abs(complex(exp.evalf(15)))
    if not base.is_number:
        digits = e  # x^{10^6} stays symbolic but would explode any expansion
    else:
        b = sympy.Abs(base).evalf(15)
        digits = e * abs(float(sympy.log(b, 10))) if b not in (0, 1) else 0.0
    if not digits <= limit:
        raise ValueError('too large to evaluate')


def _to_sympy(node):
    """Build a sympy expression from a parser AST, refusing sizes that could hang."""
    import sympy
    kind, args = node[0], node[1:]
    if kind == 'num':
        mantissa, _, exp = args[0].lower().partition('e')
        if len(mantissa) + abs(int(exp or 0)) > MAX_DIGITS:
            raise ValueError('number too long')
        return sympy.Rational(args[0])
    if kind == 'sym':
        return sympy.Symbol(args[0], positive=True)
    if kind == 'const':
        return {'e': sympy.E, 'i': sympy.I, 'pi': sympy.pi, 'oo': sympy.oo}[args[0]]
    if kind == 'func':
        name, x = args[0], _to_sympy(args[1])
        f = {'ln': sympy.log, 'arcsin': sympy.asin, 'arccos': sympy.acos, 'arctan': sympy.atan}.get(name)
        f = f or getattr(sympy, name)  # name is one of _FUNCS, all sympy functions
        return f(x) if args[2] is None else sympy.log(x, _to_sympy(args[2]))
    x = [_to_sympy(a) for a in args]
    if kind == 'pow':
        _check_size(x[0], x[1], MAX_DIGITS if x[0].is_number else 1000)
    if kind in _ARITH:
        return _ARITH[kind](*x)
    if kind == 'root':
        _check_size(x[0], 1 / x[1], MAX_DIGITS)
        if x[1].is_odd and x[0].is_negative:  # the real root for an odd index: \sqrt[3]{-8} = -2
            return -sympy.root(-x[0], x[1])
        return sympy.root(x[0], x[1])
    if kind in ('fact', 'binom'):
        if x[0].is_number and abs(complex(x[0].evalf(15))) > MAX_FACTORIAL:
            raise ValueError('factorial too large')
        return sympy.factorial(x[0]) if kind == 'fact' else sympy.binomial(x[0], x[1])
    return {'abs': sympy.Abs, 'floor': sympy.floor, 'ceil': sympy.ceiling}[kind](x[0])


def _values(exprs, symbols, trial):
    """50-digit complex values of exprs at the trial's point, or None when one is not a finite number."""
    import sympy
    subs = {s: sympy.Rational(_point(s.name, trial)) for s in symbols}
    try:
        out = [complex(e.evalf(50, subs=subs)) for e in exprs]
    except (TypeError, ValueError, ArithmeticError):
        return None
    return out if all(math.isfinite(abs(v)) for v in out) else None


def _nonzero(v):
    """Worker side: True when evalf gets 30 correct digits of a nonzero value for the number v."""
    import sympy
    try:
        return v.evalf(30, strict=True) != 0
    except Exception:  # PrecisionExhausted (v may be 0) or no value at all: no verdict
        return False


def _zero_number(v):
    """Worker side: a proof that the number v is 0: exact rewrites, then a minimal polynomial for an
    algebraic number (radicals, trig of rational multiples of pi), else Expr.equals (simplify)."""
    import sympy
    if sympy.expand_complex(v) == 0 or sympy.expand(sympy.logcombine(v)) == 0:  # e^{i pi/3}; ln 6 - ln 2 - ln 3
        return True
    try:
        return sympy.minimal_polynomial(v, sympy.Dummy('t')).is_Symbol  # the polynomial t: v is 0
    except Exception:  # NotAlgebraic (pi, ln 2) or not supported: the general tool
        return v.equals(0) is True


def _proved_zero(d, symbols):
    """Worker side: an exact proof that the sympy expression d is 0. A 50-digit zero is no proof
    (10^{20} + 1 - 10^{20} is 1, and a deep radical can sit 10^{-22} from 1). expand settles
    polynomials; a number goes to _zero_number; with variables, simplify(d) is 0, or d is exactly 0
    at each fixed point (rationals substituted: sqrt(x^2+2x+1) - x - 1, which simplify leaves alone)."""
    import sympy
    if d == 0 or sympy.expand(d) == 0:
        return True
    if not symbols:
        return not _nonzero(d) and _zero_number(d)  # evalf disproves in a millisecond
    at_points = [d.subs({s: sympy.Rational(_point(s.name, t)) for s in symbols}) for t in range(3)]
    if any(v.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo) for v in at_points):
        return sympy.simplify(d) == 0  # a pole at a point: only an identity will do
    if any(_nonzero(v) for v in at_points):
        return False  # x + 10^{-30} - x at x = 0.37
    if all(sympy.expand(v) == 0 for v in at_points) or sympy.simplify(d) == 0:  # cheap tries first
        return True
    return all(_zero_number(v) for v in at_points)


def _constant_ratio(x, y):
    """Worker side: is x / y exactly a nonzero constant?"""
    import sympy
    ratio = sympy.cancel(x / y)
    if ratio.free_symbols:
        ratio = sympy.simplify(ratio)
    return not ratio.free_symbols and ratio != 0


def _sympy_equal(kind, p, r, rel_tol):
    """Worker side: are the two whitelisted expressions (or equations, as lhs - rhs) equal? Values at
    fixed points reject; they accept only when a side is a decimal, else the decision is exact."""
    import sympy
    x, y = _to_sympy(parse_latex(p)), _to_sympy(parse_latex(r))
    if x.has(sympy.zoo, sympy.nan) or y.has(sympy.zoo, sympy.nan):
        return False
    symbols = x.free_symbols | y.free_symbols
    inexact = _inexact(p) or _inexact(r)
    if kind == 'eq':  # same solution set: (lhs - rhs) of one is a nonzero multiple of the other's
        if x == 0 or y == 0:
            return x == y
        vals = [_values([x, y], symbols, t) for t in range(3)]
        if all(v and v[1] != 0 for v in vals):
            q = [a / b for a, b in vals]
            if not (q[0] != 0 and all(abs(v - q[0]) <= 1e-9 * abs(q[0]) for v in q)):
                return False
            if inexact:
                return True
        return _constant_ratio(x, y)
    if x == y:
        return True
    for trial in range(3 if symbols else 1):
        vals = _values([x - y, x, y], symbols, trial)  # x - y itself: evalf controls the cancellation
        if vals is None:
            break  # a pole or an infinity here: let the exact check decide
        d, vx, vy = vals
        scale = abs(vy) if inexact else max(abs(vx), abs(vy))
        if abs(d) > (rel_tol if inexact else 1e-20) * scale + 1e-40:
            return False
    else:  # every point agrees: enough for a decimal, while an exact pair needs a proof
        if inexact:
            return True
    return _proved_zero(x - y, symbols)

# -----------------------------------------------------------------------------
# the sympy worker: a persistent subprocess, killed and restarted when a check runs past its limit

_WORKER_CMD = [sys.executable, os.path.abspath(__file__), '--sympy-worker']
_worker = None
_worker_lock = threading.Lock()


class _Worker:
    """`python verify.py --sympy-worker`: one JSON request per stdin line, '1' or '0' per stdout line."""

    def __init__(self):
        self.proc = subprocess.Popen(_WORKER_CMD, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.owner, self.ready = os.getpid(), False

    def readline(self, timeout):
        if not select.select([self.proc.stdout], [], [], max(timeout, 0.0))[0]:
            raise TimeoutError('sympy worker timed out')
        line = self.proc.stdout.readline()
        if not line:
            raise EOFError('sympy worker died')
        return line.strip()

    def ask(self, msg, deadline):
        if not self.ready:
            t0 = time.monotonic()
            self.ready = self.readline(STARTUP_TIMEOUT) == 'ready'
            _STARTUP_SECONDS[0] += time.monotonic() - t0  # the import is nobody's check time
        self.proc.stdin.write(json.dumps(msg) + '\n')
        self.proc.stdin.flush()
        answer = self.readline(deadline - check_clock())
        if answer == 'e':
            ERRORS['sympy'] += 1
        return answer == '1'

    def kill(self):
        self.proc.kill()
        self.proc.wait()  # reap it: no zombie
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:  # a request left half-written in the buffer of a dead worker's pipe
                pass


_STARTUP_SECONDS = [0.0]  # time spent waiting for workers to import sympy, in this process


def check_clock():
    """Seconds that count against a check's time limit: wall time less the workers' start-ups, so the first
    check after a (re)start is not cut short by the sympy import (~2 s) it had to wait for."""
    return time.monotonic() - _STARTUP_SECONDS[0]


def _ask_worker(msg, deadline):
    """Send one comparison to the worker; False when it runs past the deadline or dies."""
    global _worker
    if deadline <= check_clock():
        return False  # out of time already: do not kill a healthy worker over it
    with _worker_lock:
        if _worker is None or _worker.owner != os.getpid() or _worker.proc.poll() is not None:
            _worker = _Worker()  # first use, or a forked child must not share its parent's pipes
        try:
            return _worker.ask(msg, deadline)
        except (OSError, ValueError, TimeoutError, EOFError):
            ERRORS['timeout'] += 1
            _worker.kill()
            _worker = _Worker()  # restart now, so its sympy import overlaps the caller's next work
            return False


def _stop_worker():
    global _worker
    with _worker_lock:
        if _worker is not None and _worker.owner == os.getpid():
            _worker.kill()
        _worker = None


atexit.register(_stop_worker)


_WARM_UP = [('\\tan x', '\\frac{\\sin x}{\\cos x}'), ('\\sqrt{2}+\\sqrt{3}', '\\sqrt{5+2\\sqrt{6}}')]


def _serve():
    """Worker main loop; exits when the parent closes stdin (or dies)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us
    try:
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    except (ImportError, ValueError, OSError):
        pass
    import sympy  # noqa: F401  before 'ready', so the import never counts against a check
    for pair in _WARM_UP:  # the first simplify and minimal_polynomial load more of sympy (~0.5 s)
        _sympy_equal('expr', *pair, REL_TOL)
    print('ready', flush=True)
    for line in sys.stdin:
        try:
            answer = '1' if _sympy_equal(*json.loads(line)) else '0'
        except Exception:  # whatever sympy raises on an odd input means "not shown equal", counted by the parent
            answer = 'e'
        print(answer, flush=True)

# -----------------------------------------------------------------------------
# public API: equivalence, grade, reward, and their batch forms


# Checks that ended without a verdict and so graded "not equal": a rule that raised ('rule'), sympy raising in
# the worker ('sympy'), the worker past its deadline or dead ('timeout'). A bug would otherwise pass for a wrong
# answer; train_rl.py and evaluate.py report these counts, and the tests require zero on the labelled pairs.
ERRORS = collections.Counter()


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


def reward(response, ref, format_penalty=0.2, rel_tol=REL_TOL, timeout=TIMEOUT):
    """1.0 correct, 0.0 wrong, -format_penalty when there is no well-formed final boxed answer."""
    pred = extract_answer(response)
    if pred is None:
        return -format_penalty
    return 1.0 if is_equivalent(pred, ref, rel_tol, timeout) else 0.0


def _grade_answers(preds, refs, rel_tol, timeout):
    verdicts, out = {}, []  # a GRPO group often repeats an answer: check each distinct pair once
    for pred, ref in zip(preds, refs, strict=True):
        if (pred, ref) not in verdicts:
            verdicts[pred, ref] = pred is not None and is_equivalent(pred, ref, rel_tol, timeout)
        out.append(verdicts[pred, ref])
    return out


def grade_batch(responses, refs, rel_tol=REL_TOL, timeout=TIMEOUT):
    """[grade(x, ref) for each pair], checking repeated (answer, reference) pairs once."""
    return _grade_answers([extract_answer(x) for x in responses], refs, rel_tol, timeout)


def reward_batch(responses, refs, format_penalty=0.2, rel_tol=REL_TOL, timeout=TIMEOUT):
    """[reward(x, ref) for each pair], checking repeated (answer, reference) pairs once."""
    preds = [extract_answer(x) for x in responses]
    ok = _grade_answers(preds, refs, rel_tol, timeout)
    return [-format_penalty if p is None else float(g) for p, g in zip(preds, ok)]


# -----------------------------------------------------------------------------
# Graders: the rule the RL reward and evaluation share (train_rl.py --grader, evaluate.py --grader)

GRADERS = ("answer", "steps")  # the final answer (grade), or the tiny ladder's worked lines too (check_steps)
NUMBER_OR_OP = re.compile(r"\d+|(?<= )[+*-](?= )")  # operators stand between spaces in tiny.make_problem's text


def chain(problem):
    """(worked lines, final value) of a tiny-world expression, parsed (never evaluated) and computed left to right,
    the order tiny.make_problem applies its operations in (its brackets only ever say so)."""
    tokens = NUMBER_OR_OP.findall(problem)
    if not re.fullmatch(r"[\d+*() -]+", problem) or len(tokens) < 3 or len(tokens) % 2 == 0:
        raise ValueError(f"--grader steps grades the tiny world's expressions only, not {problem[:40]!r}")
    value, lines = int(tokens[0]), []
    for op, b in zip(tokens[1::2], tokens[2::2]):
        new = value + int(b) if op == "+" else value - int(b) if op == "-" else value * int(b)
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


def grade_with(grader, responses, problems, format_penalty=0.2):
    """(correct, rewards) of responses to problems (dicts with 'problem' and 'answer') under a grader (GRADERS):
    'answer' pays the final answer, 'steps' (the tiny ladder's) only the problem's own worked chain, so a guessed
    answer earns nothing. A reward is 1.0 right, 0.0 wrong, -format_penalty without a final boxed answer."""
    if grader == "steps":
        correct = [check_steps(r, p["problem"], p["answer"]) for r, p in zip(responses, problems, strict=True)]
    else:
        correct = grade_batch(responses, [p["answer"] for p in problems])
    rewards = [1.0 if ok else -format_penalty if extract_answer(r) is None else 0.0
               for ok, r in zip(correct, responses)]
    return correct, rewards


if __name__ == '__main__' and sys.argv[1:] == ['--sympy-worker']:
    _serve()
