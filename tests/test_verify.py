"""Tests for verify.py: hand-labelled answer pairs, the MATH-500 references, extraction, verdicts, the
batch form, and adversarial (untrusted) model output."""

import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import symbolic  # noqa: E402
import verify  # noqa: E402
from verify import extract_answer, grade, grade_batch, grade_with, is_equivalent  # noqa: E402


def rows(name):
    return [json.loads(line) for line in (ROOT / 'data' / f'{name}.jsonl').read_text().splitlines()]

# -----------------------------------------------------------------------------
# hand-labelled pairs: (prediction, reference)

EQUIVALENT = [
    # integers, decimals, thousands separators, money
    ('42', '42'), ('042', '42'), ('10,080', '10080'), ('10,\\!080', '10080'),
    ('11,\\! 111,\\! 111,\\! 100', '11111111100'), ('1{,}000', '1000'), ('32348', '\\$32,\\!348'),
    ('\\$18.90', '18.9'), ('3.0', '3'), ('.5', '0.5'), ('5.', '5'), ('$\\frac{1}{2}$', '\\frac12'),
    # fractions, mixed numbers, scientific notation
    ('0.5', '\\frac{1}{2}'), ('-0.75', '-\\frac{3}{4}'), ('1.25', '\\frac54'), ('\\frac{1}{2}', '\\dfrac12'),
    ('\\tfrac{3}{4}', '\\frac 34'), ('\\frac9{19}', '\\frac{9}{19}'), ('\\frac{-24}{25}', '-\\frac{24}{25}'),
    ('\\frac{6}{8}', '\\frac34'), ('3/4', '\\frac{3}{4}'), ('137.5', '137 \\frac{1}{2}'),
    ('\\frac95', '1\\frac{4}{5}'), ('275/2', '137\\frac12'), ('6.72\\times10^{-5}', '.0000672'),
    ('6.72e-5', '.0000672'), ('4.5\\times 10^{33}', '4.5e33'), ('4.5 \\cdot 10^{33}', '4.5e33'),
    ('2.19\\times10^{6}', '2.19e6'), ('1500', '1.5e3'), ('3\\times10^8', '300000000'),
    # relative tolerance: a decimal may be rounded (Minerva/OlympiadBench style)
    ('0.33333', '\\frac13'), ('20.3901', '20.39'), ('3.1416', '\\pi'), ('.356251', '.35625'),
    # units, degrees, percent, text (the question fixes the unit, so 30^\\circ and 30 are the same answer)
    ('30^\\circ', '30'), ('30', '30^{\\circ}'), ('106\u00b0', '106^\\circ'), ('15', '15\\mbox{ cm}^2'),
    ('864 \\mbox{ inches}^2', '864'), ('5.4', '5.4 \\text{ cents}'), ('10 dollars', '10'),
    ('\\frac{270}{7}', '\\frac{270}7\\text{ degrees}'), ('17.5\\%', '17.5'), ('17.5%', '17.5\\%'),
    ('C', '\\text{(C)}'), ('(C)', '\\text{(C)}'), ('\\textbf{(B)}', '\\text{(B)}'),
    ('evelyn', '\\text{Evelyn}'), ('EAST', '\\text{east}'), ('No Solution', '\\text{no solution}'),
    # base subscripts (the question fixes the base), variable prefixes
    ('52_8', '52_{8}'), ('2220', '2220_{4}'), ('5', 'x=5'), ('x = 5', '5'), ('[-2, 7]', 'x \\in [-2,7]'),
    ('k = 3', '3'), ('f(n) = n^2', 'n^2'),
    # surds, powers, factorials
    ('\\sqrt2', '\\sqrt{2}'), ('11\\sqrt{2}', '11\\sqrt2'), ('\\frac{1}{\\sqrt{3}}', '\\frac{\\sqrt{3}}{3}'),
    ('\\sqrt{20}', '2\\sqrt{5}'), ('\\sqrt[3]{8}', '2'), ('\\sqrt{117}', '3\\sqrt{13}'),
    ('\\sqrt{\\frac{21}{25}}', '\\frac{\\sqrt{21}}{5}'), ('11 + 11\\sqrt5', '11 \\sqrt{5} + 11'),
    ('2^{10}', '1024'), ('(10^{20}+1)-10^{20}', '1'), ('\\sqrt[3]{-8}', '-2'), ('\\sqrt{-4}', '2i'), ('5!', '120'),
    ('\\binom{5}{2}', '10'), ('|-3|', '3'), ('\\lfloor 3.7 \\rfloor', '3'),
    # pi
    ('\\pi/2', '\\frac{\\pi}{2}'), ('12 \\pi', '12\\pi'), ('2\\pi+18', '18+2\\pi'), ('-\\pi/6', '-\\frac{\\pi}{6}'),
    ('20000\\pi^{-1}', '\\frac{20000}{\\pi}'),
    # symbolic expressions
    ('-q+p', 'p - q'), ('(b+2)(a+5)', '(a+5)(b+2)'), ('ab+2a+5b+10', '(a+5)(b+2)'), ('(x+1)^2', 'x^2+2x+1'),
    ('\\frac{11}{20}+\\frac{9a}{20}', '\\frac{11+9a}{20}'), ('3 R^{2}', '3R^2'), ('2(3r^2-2r-12)', '6r^2-4r-24'),
    ('\\frac{\\cos x}{\\sin x}', '\\cot x'), ('\\sin^2 x + \\cos^2 x', '1'), ('2\\sin x\\cos x', '\\sin(2x)'),
    ('3\\ln 2', '\\ln 8'), ('\\log_2 8', '3'), ('e^{i\\pi}', '-1'),
    ('(x-1)(x^4+x^2+1)', 'x^5 - x^4 + x^3 - x^2 + x - 1'),
    ('x+1', '\\frac{x^2-1}{x-1}'), ('2(k+1)', '2k+2'), ('1+4n+8n^2', '8n^2 + 4n + 1'),
    # complex numbers
    ('6 - 5i', '6-5i'), ('-5i+6', '6 - 5i'), ('6-5\\mathrm{i}', '6-5i'), ('\\frac{5}{1-2i}', '1+2i'), ('i^2', '-1'),
    ('(1+i)^2', '2i'),
    # unordered lists, sets, \pm
    ('-2,1', '1,-2'), ('7, 5, 3', '3, 5, 7'), ('\\{1,2\\}', '2,1'), ('x=1, x=-2', '-2, 1'),
    ('1+\\sqrt{19}, 1-\\sqrt{19}', '1 \\pm \\sqrt{19}'), ('1 \\pm \\sqrt{19}', '1-\\sqrt{19},1+\\sqrt{19}'),
    ('-2, 1+\\sqrt5, 1-\\sqrt5', '\\{1\\pm\\sqrt{5},-2\\}'), ('3, -3', '\\pm 3'),
    ('3-2\\sqrt2, 3+2\\sqrt2', '3 \\pm 2 \\sqrt{2}'), ('1 \\text{ and } 2', '1, 2'), ('3, -1', '1 \\pm 2'),
    ('-x+1', '1-x'), ('-\\sqrt{2}+3', '3-\\sqrt2'),
    # ordered tuples and points
    ('(3, \\frac{\\pi}{2})', '\\left( 3, \\frac{\\pi}{2} \\right)'),
    ('(1.5, -13)', '\\left( \\frac{3}{2}, -13 \\right)'),
    ('(1, -16, -4, 43)', '(1,-16,-4,43)'), ('(2, \\sqrt{4})', '(2,2)'),
    # intervals and unions
    ('(-\\infty,0]', '(-\\infty, 0]'), ('(3,\\infty)\\cup(-\\infty,2)', '(-\\infty, 2) \\cup (3, \\infty)'),
    ('(0.6, \\frac{8}{3}]', '\\left(\\frac{3}{5},\\frac{8}{3}\\right]'),
    ('(-\\sqrt3,\\sqrt3)', '(-\\sqrt{3}, \\sqrt{3})'),
    ('[\\frac{\\pi^2}{8}, \\frac{5\\pi^2}{4}]', '\\left[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} \\right]'),
    ('\\mathbb{R}', '(-\\infty,\\infty)'),
    # matrices and vectors
    ('\\begin{bmatrix}-1&0\\\\0&-1\\end{bmatrix}', '\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}'),
    ('\\begin{pmatrix} 0.2 \\\\ -3.6 \\end{pmatrix}', '\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}'),
    ('(-2,-14,-7)', '\\begin{pmatrix} -2 \\\\ -14 \\\\ -7 \\end{pmatrix}'),
    ('\\begin{pmatrix} \\frac{16}{49} \\\\ \\frac{48}{49} \\\\ \\frac{24}{49} \\end{pmatrix}',
     '\\begin{pmatrix} 16/49 \\\\ 48/49 \\\\ 24/49 \\end{pmatrix}'),
    ('\\begin{pmatrix} 2-1 & 0 \\\\ 0 & 1 \\end{pmatrix}', '\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}'),
    # equations
    ('y=3+2x', 'y = 2x + 3'), ('2x - y + 3 = 0', 'y = 2x + 3'), ('2y = 4x + 6', 'y = 2x + 3'),
    ('-5x + 7y - 11z - 4 = 0', '5x - 7y + 11z + 4 = 0'), ('2x+y=0', 'y = -2x'), ('2x+3', 'y = 2x + 3'),
    # exact values are equal when exactly equal (sympy proves it; no tolerance is involved)
    ('10^{20}+1', '100000000000000000001'), ('\\frac{10^{30}+1}{10^{30}}', '1+10^{-30}'),
    ('\\sqrt{2}+\\sqrt{3}', '\\sqrt{5+2\\sqrt6}'), ('\\sqrt{7+4\\sqrt3}', '2+\\sqrt3'),
    ('\\sqrt[3]{2+\\sqrt5} + \\sqrt[3]{2-\\sqrt5}', '1'), ('\\frac{1}{\\sqrt2 - 1}', '\\sqrt2 + 1'),
    ('\\sqrt{x^2+2x+1}', 'x+1'), ('\\frac{x^3-1}{x-1}', 'x^2+x+1'), ('\\cos^2 x - \\sin^2 x', '\\cos 2x'),
    # trig functions of standard angles: a degree mark in the argument means pi/180
    ('\\sin 30^\\circ', '\\frac12'), ('\\cos 60^\\circ', '\\frac{1}{2}'), ('\\tan 45^\\circ', '1'),
    ('\\tan 60^\\circ', '\\sqrt3'), ('\\sin\\frac{\\pi}{4}', '\\frac{\\sqrt2}{2}'), ('\\sin 30\u00b0', '\\frac12'),
    ('\\cos(60^{\\circ})', '0.5'), ('\\frac{\\sqrt3}{2}', '\\cos 30^\\circ'), ('\\tan 15^\\circ', '2-\\sqrt3'),
    ('\\sin^2 45^\\circ', '\\frac12'), ('\\sec 60^\\circ', '2'), ('\\sin 18^\\circ', '\\frac{\\sqrt5-1}{4}'),
    ('\\sin 30\\degree', '\\sin\\frac{\\pi}{6}'), ('\\cos 20^\\circ', '\\sin 70^\\circ'),
    ('(\\sin 30^\\circ, 30^\\circ)', '(\\frac12, 30)'),
    # repeating decimals are exact fractions
    ('0.\\overline{3}', '\\frac13'), ('4.\\overline{6}', '\\frac{14}{3}'), ('0.\\overline{142857}', '\\frac17'),
    ('0.1\\overline{6}', '\\frac16'), ('-0.\\overline{81}', '-\\frac{9}{11}'), ('0.\\overline{9}', '1'),
    ('1.2\\overline{34}', '\\frac{611}{495}'), ('0.\\overline{33}', '0.\\overline{3}'), ('.\\overline3', '\\frac13'),
    # the empty set
    ('\\varnothing', '\\emptyset'), ('\\{\\}', '\\emptyset'), ('\\left\\{ \\right\\}', '\\varnothing'),
    ('\\emptyset', '\\{ \\}'),
    # a scalar times a matrix or vector
    ('-\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}', '\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}'),
    ('2\\begin{pmatrix}1\\\\3\\end{pmatrix}', '\\begin{pmatrix}2\\\\6\\end{pmatrix}'),
    ('\\frac{1}{2}\\begin{pmatrix}1\\\\3\\end{pmatrix}', '(\\frac12, \\frac32)'),
    ('3\\cdot\\begin{pmatrix}x\\\\1\\end{pmatrix}', '\\begin{pmatrix}3x\\\\3\\end{pmatrix}'),
    ('\\sqrt2\\begin{pmatrix}1\\\\1\\end{pmatrix}', '\\begin{pmatrix}\\sqrt2\\\\\\sqrt2\\end{pmatrix}'),
    ('\\begin{pmatrix}-2\\\\-6\\end{pmatrix}', '-2\\begin{bmatrix}1\\\\3\\end{bmatrix}'),
]

NOT_EQUIVALENT = [
    # integers and decimals: exact numbers never get a tolerance
    ('43', '42'), ('-42', '42'), ('10081', '10,080'), ('11111111101', '11,\\!111,\\!111,\\!100'),
    ('13536', '13535'), ('1', '0'), ('0', '0.001'), ('18.8', '\\$18.90'),
    # decimals outside the relative tolerance
    ('0.5001', '\\frac12'), ('0.3', '\\frac13'), ('0.333', '\\frac13'), ('1.4', '\\sqrt2'), ('3.14', '\\pi'),
    ('20.4', '20.39'), ('.35626', '.35625'), ('4.6e33', '4.5e33'), ('4.5e32', '4.5e33'), ('6.73e-5', '.0000672'),
    # fractions and mixed numbers
    ('\\frac{2}{3}', '\\frac{3}{2}'), ('\\frac{1}{2}', '\\frac{1}{3}'), ('-\\frac{24}{25}', '\\frac{24}{25}'),
    ('\\frac{271}{7}', '\\frac{270}7\\text{ degrees}'), ('137\\frac{1}{3}', '137\\frac{1}{2}'),
    ('\\frac{1}{2}', '1\\frac{1}{2}'), ('\\frac{4}{5}', '1\\frac{4}{5}'),
    # units, degrees, percent, text
    ('31^\\circ', '30^\\circ'), ('16', '15\\mbox{ cm}^2'), ('5.5', '5.4 \\text{ cents}'), ('17.6\\%', '17.5\\%'),
    ('\\text{(B)}', '\\text{(C)}'), ('D', '\\text{(C)}'), ('\\text{Navin}', '\\text{Evelyn}'),
    ('west', '\\text{east}'), ('odd', '\\text{even}'), ('\\text{hyperbola}', '\\text{ellipse}'),
    ('\\text{no answer}', '5'), ('5', '\\text{(C)}'), ('', '5'),
    # base subscripts and prefixes
    ('53_8', '52_8'), ('x=6', 'x=5'), ('6', 'x = 5'), ('[-2,7)', 'x \\in [-2,7]'),
    # surds, powers, factorials
    ('\\sqrt3', '\\sqrt{2}'), ('12\\sqrt2', '11\\sqrt2'), ('\\frac{\\sqrt{3}}{2}', '\\frac{\\sqrt{3}}{3}'),
    ('\\sqrt{10}', '2\\sqrt{5}'), ('\\sqrt[3]{9}', '2'), ('\\sqrt{39}', '3\\sqrt{13}'), ('2^{11}', '1024'),
    ('6!', '120'), ('\\binom{5}{3}', '5'),
    # pi
    ('\\frac{\\pi}{3}', '\\frac{\\pi}{2}'), ('12', '12\\pi'), ('18-2\\pi', '18+2\\pi'), ('\\pi/6', '-\\frac{\\pi}{6}'),
    # symbolic expressions
    ('p+q', 'p - q'), ('q-p', 'p - q'), ('P-Q', 'p - q'), ('(a+5)(b+3)', '(a+5)(b+2)'), ('ab+10', '(a+5)(b+2)'),
    ('x^2+1', '(x+1)^2'), ('3r^2', '3R^2'), ('\\tan x', '\\cot x'), ('2\\sin x', '\\sin(2x)'), ('2\\ln 2', '\\ln 8'),
    ('\\log_2 8', '2'), ('x^5 - x^4 + x^3 - x^2 + x + 1', 'x^5 - x^4 + x^3 - x^2 + x - 1'),
    ('x^8+x^7+x^6+x^5+x^4+x^3+x^2+x', 'x^8 + x^7 + x^6 + x^5 + x^4 + x^3 + x^2 + x + 1'),
    ('2k+1', '2k+2'), ('8n^2+4n-1', '8n^2 + 4n + 1'), ('k', '2k'), ('x', '5'),
    ('\\frac{11+9a}{21}', '\\frac{11+9a}{20}'),
    # complex numbers
    ('6+5i', '6-5i'), ('-6-5i', '6-5i'), ('1-2i', '\\frac{5}{1-2i}'), ('i', '-1'), ('5i', '5'),
    # lists, sets, \pm
    ('1, 2', '-2,1'), ('1', '1,-2'), ('1,-2,3', '1,-2'), ('3,5', '3, 5, 7'), ('1+\\sqrt{19}', '1 \\pm \\sqrt{19}'),
    ('1+\\sqrt{19}, 1+\\sqrt{19}', '1\\pm\\sqrt{19}'), ('1\\pm\\sqrt{5}', '\\{1\\pm\\sqrt{5},-2\\}'),
    ('2, -3', '\\pm 3'), ('3\\pm\\sqrt{2}', '3 \\pm 2 \\sqrt{2}'),
    # ordered tuples
    ('(1,2)', '(2,1)'), ('(6,-1)', '(-1,6)'), ('(3, \\frac{\\pi}{3})', '\\left( 3, \\frac{\\pi}{2} \\right)'),
    ('(1,-16,-4)', '(1,-16,-4,43)'), ('(15,29)', '(15,-29)'),
    # intervals and unions: the ends matter
    ('(-\\infty, 0)', '(-\\infty, 0]'), ('[3,4]', '(3,4]'), ('(3,4)', '(3,4]'), ('(2,\\infty)', '[2,\\infty)'),
    ('(-\\infty,2)\\cup(3,\\infty)', '(-\\infty, 2] \\cup (3, \\infty)'),
    ('(-\\infty, 3) \\cup (2, \\infty)', '(-\\infty, 2) \\cup (3, \\infty)'), ('(2,\\infty)', '(2,12) \\cup (12,102)'),
    ('(0,36)', '(0,9) \\cup (9,36)'), ('\\infty', '-\\infty'),
    # matrices and vectors
    ('\\begin{pmatrix} 1 & 0 \\\\ 0 & -1 \\end{pmatrix}', '\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}'),
    ('\\begin{pmatrix} -1 & 0 & 0 \\\\ 0 & -1 & 0 \\end{pmatrix}',
     '\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}'),
    ('\\begin{pmatrix} -7 \\\\ 16 \\end{pmatrix}', '\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}'),
    ('(-7,16,-5)', '\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}'),
    ('\\begin{pmatrix} 1/5 \\\\ 18/5 \\end{pmatrix}', '\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}'),
    # equations
    ('y = 2x - 3', 'y = 2x + 3'), ('y = 3x + 2', 'y = 2x + 3'), ('x = 2y + 3', 'y = 2x + 3'),
    ('5x - 7y + 11z - 4 = 0', '5x - 7y + 11z + 4 = 0'), ('y=2x', 'y = -2x'), ('2x+3=0', 'y = 2x + 3'),
    # exact values that floats (or 50 digits) cannot tell apart: exact means exact
    ('10^{20}+1', '10^{20}'), ('1+10^{-20}', '1'), ('\\frac{10^{30}+1}{10^{30}}', '1'),
    ('\\sqrt{' * 70 + '2' + '}' * 70, '1'),  # 2^(2^-70): 1 + 6e-22, 1.0 in float64
    ('2^{2^{-70}}', '1'), ('1-10^{-30}', '1'), ('x+10^{-30}', 'x'), ('1+x^{999}', '1'),
    ('y = 2x+3', 'y = 2x+3+10^{-30}'), ('\\frac{1}{3}', '\\frac{333333333333}{1000000000000}'),
    # trig: without the degree mark the argument is in radians
    ('\\sin 30', '\\frac12'), ('\\sin 30^\\circ', '\\sin 30'), ('\\cos 60', '\\frac12'), ('\\tan 45', '1'),
    ('\\sin 30^\\circ', '\\frac{\\sqrt3}{2}'), ('\\tan 60^\\circ', '\\sqrt2'), ('\\sin\\frac{\\pi}{4}', '\\frac12'),
    ('\\cos 30^\\circ', '30'), ('\\sin 31^\\circ', '\\frac12'),
    # repeating decimals: the bar matters
    ('0.\\overline{3}', '0.3'), ('0.3', '0.\\overline{3}'), ('0.\\overline{3}', '0.333'),
    ('0.1\\overline{6}', '0.\\overline{16}'), ('4.\\overline{6}', '4.6'), ('0.\\overline{14}', '\\frac17'),
    ('0.\\overline{3}', '\\frac{3}{10}'), ('0.\\overline{6}', '\\frac13'),
    # the empty set is not zero, the whole line, or a set with an element
    ('\\emptyset', '\\{0\\}'), ('\\varnothing', '0'), ('\\{\\}', '(-\\infty,\\infty)'),
    # a scalar times a matrix: every cell is scaled
    ('2\\begin{pmatrix}1\\\\3\\end{pmatrix}', '\\begin{pmatrix}2\\\\3\\end{pmatrix}'),
    ('-\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}', '\\begin{pmatrix}-1&0\\\\0&1\\end{pmatrix}'),
    ('3\\begin{pmatrix}1\\\\3\\end{pmatrix}', '(2,6)'),
    ('2\\begin{pmatrix}1\\\\3\\end{pmatrix}', '\\begin{pmatrix}1\\\\3\\end{pmatrix}'),
    ('x\\begin{pmatrix}1\\\\1\\end{pmatrix}', '\\begin{pmatrix}1\\\\1\\end{pmatrix}'),
]


@pytest.mark.parametrize('pred,ref', EQUIVALENT)
def test_equivalent(pred, ref):
    errors = sum(verify.ERRORS.values())
    assert is_equivalent(pred, ref)
    assert sum(verify.ERRORS.values()) == errors  # decided by a rule, not by an error taken for a verdict


@pytest.mark.parametrize('pred,ref', NOT_EQUIVALENT)
def test_not_equivalent(pred, ref):
    errors = sum(verify.ERRORS.values())
    assert not is_equivalent(pred, ref)
    assert sum(verify.ERRORS.values()) == errors, dict(verify.ERRORS)  # "not equal" because it is not, not a crash


def test_labelled_tables_are_consistent():
    assert len(EQUIVALENT) >= 100 and len(NOT_EQUIVALENT) >= 100
    assert not set(EQUIVALENT) & set(NOT_EQUIVALENT)  # no pair labelled both ways
    assert not {(r, p) for p, r in EQUIVALENT} & set(NOT_EQUIVALENT)  # equality is symmetric


def test_internal_errors_grade_wrong_and_are_counted(monkeypatch):
    before = dict(verify.ERRORS)

    def broken(*args):
        raise KeyError('a bug in a rule')
    monkeypatch.setattr(verify, '_equiv', broken)
    assert is_equivalent('1', '1') is False and verify.ERRORS['rule'] == before.get('rule', 0) + 1

# -----------------------------------------------------------------------------
# the data sets' own references


def test_math500_references():
    bad = []
    for row in rows('math500'):
        ref, boxed = row['answer'], extract_answer(row['solution'])
        if not is_equivalent(ref, ref) or boxed is None or not is_equivalent(boxed, ref):
            bad.append((ref, boxed))
    assert not bad


def test_dollar_wrapped_and_decimal_references():
    for row in rows('olympiadbench') + rows('minerva'):
        assert is_equivalent(row['answer'], row['answer'])
    assert is_equivalent('\\frac{1}{2}', '$\\frac{1}{2}$') and is_equivalent('69, 84', '$69$,$84$')
    assert is_equivalent('4.5001e33', '4.5e33') and not is_equivalent('4.6e33', '4.5e33')
    assert is_equivalent('0.334', '0.33', rel_tol=0.02) and not is_equivalent('0.334', '0.33')


def test_tolerance_only_for_decimals():
    """rel_tol is for an answer written as a decimal, which may be rounded; exact values never get it."""
    assert is_equivalent('0.33333', '\\frac13') and not is_equivalent('0.333', '\\frac13')
    assert is_equivalent('0.333', '\\frac13', rel_tol=2e-3)  # the decimal earns the stated tolerance
    assert not is_equivalent('\\frac{333}{1000}', '\\frac13', rel_tol=2e-3)  # an exact fraction does not
    assert is_equivalent('0.142857', '0.\\overline{142857}')  # 1/7 correctly rounded
    assert is_equivalent('1.0', '1+10^{-20}') and is_equivalent('3.14159', '\\pi+10^{-30}')
    for pred, ref in [('10^{20}+1', '10^{20}'), ('1+10^{-20}', '1'), ('\\frac{10^{30}+1}{10^{30}}', '1'),
                      ('x+10^{-30}', 'x'), ('\\sqrt2', '\\frac{99}{70}'), ('\\frac{1}{3}', '\\frac{333}{1000}'),
                      ('0.\\overline{3}', '\\frac{333}{1000}'), ('\\sin 30^\\circ', '\\frac{499}{1000}')]:
        assert not is_equivalent(pred, ref, rel_tol=0.5), (pred, ref)


def test_grade_applies_the_exact_rule():
    """The rules hold through grade and the batch forms on whole boxed responses."""
    filler = 'We expand, simplify and check each case carefully. ' * 20
    wrong = [('10^{20}+1', '10^{20}'), ('1+10^{-20}', '1'), ('\\frac{10^{30}+1}{10^{30}}', '1'),
             ('2^{2^{-70}}', '1'), ('\\sin 30', '\\frac12'), ('0.3', '0.\\overline{3}')]
    right = [('(10^{20}+1)-10^{20}', '1'), ('0.\\overline{3}', '\\frac13'), ('\\sin 30^\\circ', '\\frac12'),
             ('\\tan 60^\\circ', '\\sqrt{3}'), ('\\varnothing', '\\emptyset'), ('0.33333', '\\frac13'),
             ('-\\begin{pmatrix}1&0\\\\0&1\\end{pmatrix}', '\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}')]
    pairs = [(f'{filler}So the answer is $\\boxed{{{x}}}$.', ref) for x, ref in wrong + right]
    want = [False] * len(wrong) + [True] * len(right)
    assert [grade(x, ref) for x, ref in pairs] == want
    responses, refs = zip(*pairs)
    assert grade_batch(responses, refs) == want
    assert grade_with('answer', responses, [dict(problem='', answer=r) for r in refs]) == want

# -----------------------------------------------------------------------------
# extraction, verdicts, batch


@pytest.mark.parametrize('text,want', [
    ('so \\boxed{\\frac{1}{2}}.', '\\frac{1}{2}'),
    ('\\boxed{\\left\\{ 1, 2 \\right\\}}', '\\left\\{ 1, 2 \\right\\}'),
    ('\\boxed{{a}^{b_{c}}}', '{a}^{b_{c}}'),
    ('The answer is $\\boxed 5$.', '5'),
    ('\\boxed {7}', '7'),
    ('\\fbox{12}', '12'),
    ('first \\boxed{1}, then \\boxed{2}', '2'),
    ('\\boxed{1} and finally \\fbox{3}', '3'),
    ('no box here: 42', None),
    ('\\boxed{}', None),
    ('\\boxed{1} then \\boxed{\\frac{2}{3}', None),  # the last box is cut off
    ('\\boxedfoo{3}', None),
    (None, None),
])
def test_extract_answer(text, want):
    assert extract_answer(text) == want


def test_verdicts_need_a_final_box():
    """A verdict only (what it is paid: reward.py): right, wrong, and no well-formed box is wrong."""
    assert grade('so the answer is \\boxed{\\frac12}', '0.5') is True
    assert grade('so the answer is \\boxed{3}', '0.5') is False
    assert grade('so the answer is 0.5', '0.5') is False and grade('\\boxed{0.5', '0.5') is False
    assert grade('\\boxed{x = 5}', '5') and not grade('x = 5', '5')
    row = dict(problem='1 + 2', answer='3')  # steps: the worked chain too, so a bare right box fails
    assert grade_with('steps', ['1 + 2 = 3\n\\boxed{3}', '\\boxed{3}'], [row, row]) == [True, False]
    assert grade_with('answer', ['1 + 2 = 3\n\\boxed{3}', '\\boxed{3}'], [row, row]) == [True, True]


def test_batch_matches_single():
    pairs = [('\\boxed{1}', '1'), ('\\boxed{2}', '1'), ('no box', '1'),
             ('\\boxed{\\frac{\\sqrt3}{3}}', '\\frac{1}{\\sqrt3}'),
             ('\\boxed{1,-2}', '-2,1'), ('\\boxed{(1,2)}', '(2,1)'), ('\\boxed{1}', '1'), ('\\boxed{2x+3}', 'y=2x+3')]
    responses, refs = zip(*pairs)
    assert grade_batch(responses, refs) == [grade(x, r) for x, r in pairs]
    with pytest.raises(ValueError):
        grade_batch(['\\boxed{1}'], [])


def test_plain_numbers_never_start_the_worker():
    symbolic._stop_worker()
    answers = ('3', '0.5', '\\frac{3}{4}', '-7', '1,000', '2.5e3', '30^\\circ', '0.\\overline{6}', '0.3',
               '\\varnothing', '-2\\begin{pmatrix}1\\\\3\\end{pmatrix}')
    responses = [f'\\boxed{{{x}}}' for x in answers]
    refs = ['3', '\\frac12', '0.75', '7', '1000', '2500', '30', '\\frac23', '0.\\overline{3}', '\\{\\}', '(-2,-6)']
    assert grade_batch(responses, refs) == [True, True, True, False, True, True, True, True, False, True, True]
    assert symbolic._worker is None

# -----------------------------------------------------------------------------
# untrusted output: fast, no side effects, no exceptions

LIMIT = 1.0
MARKER = Path('/tmp/pwned')


def adversarial(tmp):
    touch = f"__import__('os').system('touch {tmp}/pwned')"
    return [
        touch, f'\\boxed{{{touch}}}', "\\boxed{__import__('os').system('touch /tmp/pwned')}",
        f'\\boxed{{eval("{touch}")}}', f'\\boxed{{exec("{touch}")}}', "\\boxed{lambda: open('/etc/passwd').read()}",
        '\\boxed{().__class__.__bases__[0].__subclasses__()}', "\\boxed{Symbol('x').__class__}",
        '\\boxed{\\input{/etc/passwd}}', '\\boxed{\\write18{touch /tmp/pwned}}',
        '\\boxed{9^{9^{9^9}}}', '\\boxed{10^{10^{10}}}', '\\boxed{2^{2^{2^{2^{2^{2}}}}}}', '\\boxed{(10^{10^{10}})!}',
        '\\boxed{1000000!}', '\\boxed{10^{1000000}}', '\\boxed{1e1000000}', '\\boxed{x^{10^{9}}}',
        '\\boxed{(x+1)^{99999}}',
        '\\boxed{\\sqrt[0.00001]{10}}', '\\boxed{\\binom{10^{9}}{5}}', '\\boxed{\\sin(10^{9999})}',
        '\\boxed{' + '10^{999}\\cdot' * 80 + '1}', '\\boxed{\\frac{1}{0}}', '\\boxed{0^{-1}}',
        'a' * 1_000_000 + '\\boxed{5}', '\\boxed{' + '1' * 1_000_000 + '}', '\\boxed{' + 'x+' * 400_000 + '1}',
        '\\boxed{' + '{' * 10_000 + '1' + '}' * 10_000 + '}', '\\boxed{' + '(' * 10_000 + '1' + ')' * 10_000 + '}',
        '\\boxed{' + '{' * 400 + '1' + '}' * 400 + '}', '\\boxed{' + '-' * 900 + '1}',
        '\\boxed{' + '{' * 10_000, '\\boxed{1}}}}}}', '}}}{{{\\boxed{', '\\boxed{\\frac{1}{2}',
        '\\boxed{1\x002}', '\x00' * 1000 + '\\boxed{\x00}', '\\boxed{\ud800}', 'abc\udfff\\boxed{5\ud800}',
        '\\boxed{\\text{\ud83d}}', b'\\boxed{5}', None, 12345,
        '\\boxed{0.\\overline{' + '9' * 5000 + '}}', '\\boxed{0.\\overline{' + '7' * 400 + '}}',
        '\\boxed{' + '0.\\overline{3}' * 60 + '}', '\\boxed{\\sin 10^{9999}^\\circ}', '\\boxed{\\tan 90^\\circ}',
        '\\boxed{' + '\\sin 1^\\circ' * 150 + '}', '\\boxed{\\sin(' + '30^\\circ' * 150 + ')}',
        '\\boxed{10^{10^{10}}\\begin{pmatrix}1\\\\2\\end{pmatrix}}',
        '\\boxed{2\\begin{pmatrix}' + '1\\\\' * 400 + '\\end{pmatrix}}',
        '\\boxed{\\begin{pmatrix}1\\end{pmatrix}' * 60 + '}',
    ]


@pytest.fixture(scope='module')
def warm_worker():
    assert is_equivalent('x+1', '1+x')  # start-up is not part of a check's time limit


@pytest.mark.parametrize('i', range(len(adversarial('/tmp'))))
def test_adversarial(i, tmp_path, warm_worker):
    response = adversarial(tmp_path)[i]
    pwned_before = MARKER.stat().st_mtime_ns if MARKER.exists() else None  # touching it would change this
    for ref in ('5', '0', 'x', '10^{1000000}'):
        is_equivalent('x+1', '1+x')  # make sure a restarted worker is up before timing
        start = time.monotonic()
        value = grade(response, ref, timeout=LIMIT)
        assert time.monotonic() - start < LIMIT + 0.5
        # none of these is a disguised right answer: only a box holding the reference itself is right
        boxed = extract_answer(response)
        assert value == (boxed is not None and boxed.strip() == ref), (ref, value)
    assert grade_batch([response], ['5'], timeout=LIMIT) == [grade(response, '5', timeout=LIMIT)]
    assert not (tmp_path / 'pwned').exists()
    assert (MARKER.stat().st_mtime_ns if MARKER.exists() else None) == pwned_before


@pytest.mark.parametrize('pred,ref', [
    ('\\sqrt{' * 70 + '2' + '}' * 70, '1'), ('2^{2^{-70}}', '1'),
    ('(1+10^{-50})^{1000}', '1'), ('1+x^{999}', '1'), ('e^{\\pi\\sqrt{163}}', '262537412640768744'),
    ('\\pi', '\\frac{245850922}{78256779}'), ('\\cos 1^\\circ', '\\cos 1^\\circ+10^{-40}'),
])
def test_exact_near_misses_are_fast(pred, ref, warm_worker):
    """Exact values that agree to 20+ digits: rejected by an exact check, within the time limit."""
    is_equivalent('x+1', '1+x')  # make sure a restarted worker is up before timing
    start = time.monotonic()
    assert not is_equivalent(pred, ref, timeout=LIMIT)
    assert time.monotonic() - start < LIMIT + 0.5


def test_degrees_in_a_trig_argument_survive_normalization():
    assert verify.normalize_answer('\\sin 30^\\circ + 30^\\circ, 45^\\circ') == '\\sin30\\degree+30\\degree,45'

# -----------------------------------------------------------------------------
# the ladder's grader: the worked lines, not only the answer (the tiny world's own problems: tests/test_tiny.py)


def test_check_steps_pays_the_worked_chain_only():
    problem = '(3 + 4) * 2 - 5'  # left to right: 3 + 4 = 7, 7 * 2 = 14, 14 - 5 = 9
    assert verify.operations(problem) == (3, [('+', 4), ('*', 2), ('-', 5)])
    assert verify.chain(problem) == (['3 + 4 = 7', '7 * 2 = 14', '14 - 5 = 9'], 9)
    worked = '3 + 4 = 7\n7 * 2 = 14\n\n14 - 5 = 9\n\\boxed{9}'
    assert verify.check_steps(worked, problem, '9') and verify.check_steps(worked.replace(' ', ''), problem, ' 9')
    assert not verify.check_steps('\\boxed{9}', problem, '9')  # a bare answer
    assert not verify.check_steps(worked.replace('7 * 2 = 14', '7 * 2 = 15'), problem, '9')  # a wrong line
    assert not verify.check_steps(worked + '\nso 9', problem, '9')  # anything after the box
    assert not verify.check_steps(worked, problem, '10')  # the worked chain disagrees with the stated answer


def test_first_error_names_the_first_line_that_leaves_the_chain():
    problem = '(3 + 4) * 2 - 5'  # 3 + 4 = 7, 7 * 2 = 14, 14 - 5 = 9
    assert verify.first_error('3 + 4 = 7\n7 * 2 = 14\n14 - 5 = 9\n\\boxed{8}', problem) == (3, 'tail')
    assert verify.first_error('3 + 4 = 7\n\\boxed{7}', problem) == (1, 'stopped')
    assert verify.first_error('3 + 4 = 7\n8 * 2 = 16', problem) == (1, 'carry')  # not the previous result
    assert verify.first_error('3 + 4 = 7\n7 * 3 = 21', problem) == (1, 'operand')  # a number not the problem's
    assert verify.first_error('3 + 4 = 7\n7 * 2 = 15', problem) == (1, 'arithmetic')
    assert verify.first_error('3 + 4 makes 7', problem) == (0, 'malformed')
    assert verify.first_error('3 + 4 = 7\n7 * 2 = 14', problem) == (2, 'short')


@pytest.mark.parametrize('problem', ['1 + 2 3', '1 + 2 3 + 4', '1 + 2 *', '-1 + 2', '7', 'What is $1 + 1$?', '2 ** 3'])
def test_chain_refuses_what_is_not_a_tiny_expression(problem):
    with pytest.raises(ValueError, match='--grader steps'):
        verify.operations(problem)
    with pytest.raises(ValueError, match='--grader steps'):
        verify.chain(problem)


def test_pathological_answers_cost_at_most_the_limit_in_wall_time(warm_worker):
    # back to back, no warm-up between: a check past its limit used to cost the next one a worker restart (the
    # sympy import, ~1.2 s, not counted against the limit): 2.0 s answers took ~3.2 s each
    slow = ('(a+b+c+d)^{40}(a-b)', '(a+b+c+d)^{40}a-(a+b+c+d)^{40}b')  # equal, but sympy's proof takes many seconds
    cases = [slow, slow, ('10^{10^{10^{10}}}', '5'), ('\\frac{1}{' * 300 + '2' + '}' * 300, '2'),
             ('1+' * 50_000 + '1', '2'), ('x^{10^{9}}+1', 'x^{10^{9}}'), slow]
    before, waited = verify.ERRORS['timeout'], symbolic._STARTUP_SECONDS[0]
    for pred, ref in cases:
        start = time.monotonic()
        assert not is_equivalent(pred, ref, timeout=LIMIT)
        assert time.monotonic() - start < LIMIT + 0.4, pred[:40]
    assert verify.ERRORS['timeout'] == before + 3
    assert symbolic._STARTUP_SECONDS[0] == waited  # no check waited for a restarted worker
