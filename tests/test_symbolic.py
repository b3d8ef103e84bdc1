"""Tests for symbolic.py: the whitelist parser, `equal` on expressions and equations (hand-checked pairs), the
deadline, and the sympy worker's life (not started by an import, start-up not charged to a check, killed when
stuck, its errors counted). verify.py's tests cover the same code end to end through is_equivalent."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import symbolic  # noqa: E402


def test_parser_whitelist():
    for s in ["__import__('os')", '\\input{x}', 'os.system', 'x.y', 'lambda', "'a'", '1;2', '-.', '\\eval{1}',
              'abc', '1' * (symbolic.MAX_CHARS + 1)]:
        assert symbolic.parse_latex(s) is None, s
    assert symbolic.parse_latex('\\frac{1}{2}+3x^2\\sqrt[3]{y}-\\sin\\theta') is not None
    assert symbolic.parse_latex('2x+1') == ('add', ('mul', ('num', '2'), ('sym', 'x')), ('num', '1'))
    degree = ('div', ('const', 'pi'), ('num', '180'))  # 30\degree is 30 * pi / 180
    assert symbolic.parse_latex('\\sin 30\\degree') == ('func', 'sin', ('mul', ('num', '30'), degree), None)


@pytest.mark.parametrize('kind,p,r,want', [
    ('expr', '\\frac{\\sin x}{\\cos x}', '\\tan x', True),        # an identity simplify proves
    ('expr', '\\sqrt{2}+\\sqrt{3}', '\\sqrt{5+2\\sqrt{6}}', True),  # a minimal polynomial proves
    ('expr', '\\sqrt{x^2}', 'x', True),                            # variables are positive reals
    ('expr', '\\sin 30\\degree', '\\frac{1}{2}', True),
    ('expr', '10^{20}+1', '10^{20}', False),                       # exact: no tolerance without a decimal
    ('expr', '3.1416', '\\pi', True),                              # a decimal earns rel_tol
    ('expr', '3.15', '\\pi', False),
    ('expr', 'x^2-1', '(x-1)(x+1)', True),
    ('expr', 'x^2+1', '(x-1)(x+1)', False),
    ('eq', '(y)-(2x+3)', '(2x-y+3)-(0)', True),                    # y = 2x + 3 and 2x - y + 3 = 0: a factor of -1
    ('eq', '(y)-(2x+3)', '(2x-y+4)-(0)', False),
    ('eq', '(1)-(2)', '(x)-(x)', False),                           # no solution against every x: 0 is no multiple
    ('eq', '(x)-(x)', '(2)-(2)', True),
    ('expr', 'the answer', '5', False),                            # outside the whitelist
])
def test_equal(kind, p, r, want):
    assert symbolic.equal(kind, p, r, 1e-4, symbolic.check_clock() + 30) is want


def test_past_its_deadline_equal_says_false_and_leaves_the_worker_alone():
    assert symbolic.equal('expr', 'x+1', '1+x', 1e-4, symbolic.check_clock() + 30)  # the worker is up
    worker = symbolic._worker
    assert symbolic.equal('expr', 'x+1', '1+x', 1e-4, symbolic.check_clock() - 1) is False
    assert symbolic._worker is worker and worker.proc.poll() is None


def test_a_sympy_error_is_counted_and_grades_unequal():
    before = symbolic.ERRORS['sympy']
    assert symbolic._ask_worker(['expr', 'no such', 'node', 1e-4], symbolic.check_clock() + 30) is False
    assert symbolic.ERRORS['sympy'] == before + 1


def test_import_does_not_start_the_worker():
    code = 'import verify, symbolic, sys; sys.exit(symbolic._worker is not None)'
    assert subprocess.run([sys.executable, '-c', code], cwd=ROOT).returncode == 0


def test_the_first_check_is_not_cut_short_by_the_worker_start_up():
    # two items that each need sympy, in a fresh process: the ~2 s import must not eat the check's 2 s limit
    code = ("import verify, sys; ok = verify.is_equivalent('3, -1', '1 \\\\pm 2', timeout=1.0); "
            "sys.exit(0 if ok and not verify.ERRORS else 1)")
    assert subprocess.run([sys.executable, '-c', code], cwd=ROOT).returncode == 0


def test_stuck_worker_is_killed(tmp_path, monkeypatch):
    """A worker stuck in C code (here: sleeping) costs one time limit, then is killed and replaced."""
    pids = tmp_path / 'pids'
    script = (f"import os, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); "
              "print('ready', flush=True); time.sleep(60)")
    symbolic._stop_worker()
    monkeypatch.setattr(symbolic, '_WORKER_CMD', [sys.executable, '-c', script])
    start = time.monotonic()
    assert not symbolic.equal('expr', 'x+1', '1+x', 1e-4, symbolic.check_clock() + 0.5)
    assert time.monotonic() - start < 1.5
    symbolic._stop_worker()  # the replacement started after the kill
    monkeypatch.undo()
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):  # killed and reaped: not even a zombie
            os.kill(pid, 0)
    assert symbolic.equal('expr', 'x+1', '1+x', 1e-4, symbolic.check_clock() + 30)


def test_a_worker_stuck_in_c_code_is_replaced_by_a_warm_spare(tmp_path, monkeypatch):
    """A worker that ignores its limit (stuck in C code: here sleeping) is killed KILL_GRACE past it; from the first
    kill on a warm spare takes over, so a run of such answers costs each check its limit, not a restart too."""
    pids = tmp_path / 'pids'
    script = (f"import os, sys, time; open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n'); time.sleep(0.4); "
              "print('ready', flush=True); sys.stdin.readline(); time.sleep(60)")
    symbolic._stop_worker()
    monkeypatch.setattr(symbolic, '_WORKER_CMD', [sys.executable, '-c', script])
    walls = []
    for _ in range(4):
        start = time.monotonic()
        assert not symbolic.equal('expr', 'x+1', '1+x', 1e-4, symbolic.check_clock() + 0.6)
        walls.append(time.monotonic() - start)
    symbolic._stop_worker()
    monkeypatch.undo()
    assert all(w < 0.6 + symbolic.KILL_GRACE + 0.2 for w in walls[2:]), walls  # the first kill's replacement starts cold
    for pid in map(int, pids.read_text().split()):
        with pytest.raises(ProcessLookupError):  # every worker and spare killed and reaped
            os.kill(pid, 0)
    assert symbolic.equal('expr', 'x+1', '1+x', 1e-4, symbolic.check_clock() + 30)
