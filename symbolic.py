"""
The symbolic half of verify.py: is one whitelisted LaTeX expression equal to another? verify.py's rules settle
strings, plain numbers and structure (lists, tuples, matrices, equations); what is left comes here as two
normalized strings, and `equal` decides it in three stages:
 1. A small whitelist parser (numbers, one-letter and Greek variables, + - * / ^, implicit products, \\frac,
    \\sqrt[n], \\pi, e, i, \\infty, trig and log functions, !, |x|, floor/ceil, \\binom) turns each side into a
    tuple AST; text outside the whitelist gets None, and the pair then compares as strings only (already unequal).
 2. A float evaluation at fixed points rejects clearly different pairs at once; most wrong answers stop here.
 3. The rest go to a sympy worker process that evaluates both sides at those points with 50 digits, which also
    only rejects, unless a side is a decimal. Exact answers are decided exactly: a proof (rational arithmetic,
    expand, simplify, a minimal polynomial for algebraic numbers, and, with variables, an exact zero of the
    difference at each fixed point). Variables are taken to be positive reals (lengths, counts), so sqrt(x^2) = x.
Safety: model output never reaches eval/exec/sympify; sympy objects are built from our own parse. Sizes are
bounded before sympy evaluates (answer length, exponents, factorials), and all sympy work runs in a persistent
worker process (`python symbolic.py --sympy-worker`) that stops a check at its time limit and stays warm; one stuck
in C code past the limit is killed, and a warm spare takes over. A pathological answer compares as unequal; it never
raises or stalls the caller, and costs at most the limit (verify.TIMEOUT) in wall time.
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

MAX_CHARS = 1000        # longer answers compare as strings only (reference answers are < 250 chars)
MAX_DIGITS = 10_000     # refuse powers whose value would need more digits (9^{9^{9^9}})
MAX_FACTORIAL = 1000    # refuse n! above this n ((10^{10^{10}})!)
STARTUP_TIMEOUT = 60.0  # the worker's one-off sympy import; not counted against a check's limit
KILL_GRACE = 0.2        # seconds past a check's limit before a worker that did not stop itself is killed
WORKER_MEMORY = 4 << 30  # address-space cap of the worker, so a huge computation fails instead of swapping

# Checks that ended without a verdict and so graded "not equal": a rule that raised ('rule', counted by verify.py),
# sympy raising in the worker ('sympy'), the worker past its deadline or dead ('timeout'). A bug would otherwise pass
# for a wrong answer; train_rl.py and evaluate.py report these counts (as verify.ERRORS), and the tests require zero
# on the labelled pairs.
ERRORS = collections.Counter()

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
    """A side written as a decimal (0.333, 2e-5) may have been rounded: only it earns rel_tol."""
    return re.search(r'\d\.|\.\d|\d[eE][-+]?\d', s) is not None


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
    """`python symbolic.py --sympy-worker`: one JSON request per stdin line, '1' or '0' per stdout line."""

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
        left = deadline - check_clock()
        self.proc.stdin.write(json.dumps(msg + [left]) + '\n')
        self.proc.stdin.flush()
        answer = self.readline(left + KILL_GRACE)  # it stops itself at `left`; stuck in C code, it is killed
        if answer == 't':
            ERRORS['timeout'] += 1
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
            # a worker stuck in C code: the spare (warm since the last kill) takes over and a new spare starts now,
            # so a run of such answers costs each check its limit, not its limit plus a restart
            spare = _spares.pop() if _spares else None
            usable = spare is not None and spare.owner == os.getpid() and spare.proc.poll() is None
            _worker = spare if usable else _Worker()
            _spares.append(_Worker())
            return False


_spares = []  # a warm stand-by worker, from the first kill on


def _stop_worker():
    global _worker
    with _worker_lock:
        for w in [_worker, *_spares]:
            if w is not None and w.owner == os.getpid():
                w.kill()
        _worker = None
        _spares.clear()


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
        _sympy_equal('expr', *pair, 0.0)  # exact pairs: no tolerance applies
    signal.signal(signal.SIGALRM, _out_of_time)
    print('ready', flush=True)
    for line in sys.stdin:
        try:
            *request, seconds = json.loads(line)
            signal.setitimer(signal.ITIMER_REAL, max(seconds, 1e-3))  # stop at the check's limit, still warm
            try:
                answer = '1' if _sympy_equal(*request) else '0'
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _OutOfTime:
            answer = 't'
        except Exception:  # whatever sympy raises on an odd input means "not shown equal", counted by the parent
            answer = 'e'
        print(answer, flush=True)


class _OutOfTime(BaseException):
    """Raised in the worker when a check reaches its limit: a BaseException, so sympy's `except Exception` blocks
    cannot swallow it. The worker then answers 't' and stays up, so the next check does not wait for a restart
    (~1-2 s of sympy import); only a worker stuck in C code past the limit is killed."""


def _out_of_time(signum, frame):
    raise _OutOfTime

# -----------------------------------------------------------------------------
# the one entry point verify.py calls


def equal(kind, p, r, rel_tol, deadline):
    """Are two normalized answers equal expressions (kind 'expr') or equations with the same solutions (kind 'eq',
    each side given as lhs - rhs)? Float pre-check here, then sympy in the worker; False when either side is outside
    the whitelist, or the check runs past deadline (a check_clock() time)."""
    a, b = parse_latex(p), parse_latex(r)
    if a is None or b is None:
        return False  # outside the whitelist: the strings already differed
    if kind == 'expr' and _clearly_differ(a, b, rel_tol if _inexact(p) or _inexact(r) else 0.0):
        return False
    return _ask_worker([kind, p, r, rel_tol], deadline)


if __name__ == '__main__' and sys.argv[1:] == ['--sympy-worker']:
    _serve()
