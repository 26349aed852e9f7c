"""MATH scoring: the last box, verl's normalisation, symbolic equivalence, and the time limit."""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path

import pytest

from queryrl.rewards.scorers.math import (
    compute_score,
    extract_answer,
    is_equiv,
    last_boxed_only_string,
    normalize_answer,
    remove_boxed,
    sympy_equal,
)


@pytest.mark.parametrize(
    ("text", "boxed"),
    [
        (r"so \boxed{\frac{1}{2}}.", r"\boxed{\frac{1}{2}}"),
        (r"\boxed{\frac{\sqrt{3}}{2}}", r"\boxed{\frac{\sqrt{3}}{2}}"),  # nested braces
        (r"first \boxed{1}, then \boxed{2}", r"\boxed{2}"),  # the last box wins
        (r"\boxed{1} and \fbox{3}", r"\fbox{3}"),
        (r"The answer is $\boxed 5$.", r"\boxed 5"),  # the brace-less form stops at $
        (r"\boxed 7 then \boxed{8}", r"\boxed{8}"),  # verl would take "\boxed 7 ..." here
        (r"\boxed {4}", r"\boxed {4}"),
        (r"cut off: \boxed{\frac{1}{2}", None),  # unclosed: a truncated response
        (r"\boxeds{3}", None),  # not the \boxed command
        ("no box here", None),
        ("", None),
    ],
)
def test_last_boxed_only_string(text: str, boxed: str | None) -> None:
    assert last_boxed_only_string(text) == boxed


def test_remove_boxed() -> None:
    assert remove_boxed(r"\boxed{\frac{1}{2}}") == r"\frac{1}{2}"
    assert remove_boxed(r"\fbox{3}") == "3"
    assert remove_boxed(r"\boxed 5") == "5"
    assert remove_boxed(r"\boxed {4}") == "4"
    with pytest.raises(ValueError, match="not a boxed answer"):
        remove_boxed("5")
    assert extract_answer(r"x \boxed{a} y \boxed{b}") == "b"


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (r"\dfrac{3}{4}", r"\frac{3}{4}"),
        (r"\tfrac12", r"\frac{1}{2}"),  # \frac12 -> \frac{1}{2}
        (r"\frac1{72}", r"\frac{1}{72}"),
        ("3/4", r"\frac{3}{4}"),
        (r"\left( 1, 2 \right)", "(1,2)"),
        (r"\rightarrow", r"\rightarrow"),  # only the \left/\right commands go, not \rightarrow
        (r"90^\circ", "90"),
        (r"90^{\circ}", "90"),
        (r"\$5", "5"),
        (r"5 \text{ cm}", "5"),  # a unit on the right
        (r"\text{Monday}", "Monday"),
        (r"10\%", "10"),
        ("5.", "5"),  # a sentence's full stop
        (".5", "0.5"),
        ("-.5", "-0.5"),
        ("1,000", "1000"),  # thousands separators
        ("1,2", "1,2"),  # two solutions: left alone
        ("x = 5", "5"),  # a short left-hand side goes
        ("xyz = 5", "xyz=5"),  # a long one stays
        (r"2\sqrt3", r"2\sqrt{3}"),
        (r"1\,000", "1000"),
    ],
)
def test_normalize_answer(raw: str, normal: str) -> None:
    assert normalize_answer(raw) == normal


@pytest.mark.parametrize(
    ("response", "gold", "score"),
    [
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{1/2}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\dfrac{1}{2}}", r"\frac12", 1.0),
        (r"\boxed{2}", r"\sqrt{4}", 1.0),
        (r"\boxed{1+2x}", "2x+1", 1.0),
        (r"\boxed{2x+2}", "2x+1", 0.0),
        (r"\boxed{3.14159}", r"\pi", 0.0),  # the float tolerance is not for constants
        (r"\boxed{1,000}", "1000", 1.0),
        (r"\boxed{x=5}", "5", 1.0),  # documented: a short left-hand side is dropped
        (r"\boxed{-3}", "-3", 1.0),
        (r"\boxed{-3}", "3", 0.0),
        (r"\boxed{3}", "-3", 0.0),
        (r"\boxed{10}", r"10\%", 1.0),  # documented: percent as verl strips it ...
        (r"\boxed{0.1}", r"10\%", 1.0),  # ... and as math-verify reads it (10/100)
        (r"\boxed{10\%}", "0.1", 1.0),  # both ways round
        (r"\boxed{1.2345678}", "1.2345679", 1.0),  # documented: decimals agree within 1e-6 relative
        (r"\boxed{1.2346}", "1.2345", 0.0),
        (r"\boxed{(3,4)}", "3,4", 1.0),  # documented: a pair and two solutions read alike, both ways
        (r"\boxed{3,4}", "(3,4)", 1.0),
        (r"\boxed{[1,2)}", "[1,2)", 1.0),
        (r"\boxed{(1,2]}", "[1,2)", 0.0),  # an interval's ends matter
        (r"\boxed{\{2,1\}}", r"\{1,2\}", 1.0),  # a set's order does not
        (r"\boxed{5 \text{ cm}}", "5", 1.0),
        (r"\boxed{\text{(B)}}", r"\text{(A)}", 0.0),
        (r"\boxed{41}", "42", 0.0),
        ("The answer is 42.", "42", 0.0),  # no box, no score
        (r"\boxed{}", "", 0.0),  # an empty box is no answer
        (r"\boxed{1} no wait \boxed{2}", "2", 1.0),
        (r"\boxed{1} no wait \boxed{2}", "1", 0.0),
        (r"\boxed{4}", r"The area is \boxed{4}.", 1.0),  # a whole reference solution: its box
        (r"\boxed{72}", 72, 1.0),  # a number as ground truth
    ],
)
def test_compute_score(response: str, gold: object, score: float) -> None:
    assert compute_score(response, gold) == score


@pytest.mark.parametrize(
    ("gold", "answer", "equal"),
    [
        (r"\frac{1}{2}", "0.5", True),  # a decimal against an exact number: relative 1e-6
        (r"\frac{1}{3}", "0.333333", True),  # |1/3 - 0.333333| / (1/3) = 1e-6
        (r"\frac{1}{3}", "0.3333", False),
        (r"\sqrt{4}", "2", True),
        ("2x+1", "1+2x", True),
        (r"\pi", "3.14159", False),  # pi is not a number literal: simplify(pi - 3.14159) != 0
        ("-3", "3", False),
    ],
)
def test_sympy_fallback(gold: str, answer: str, equal: bool) -> None:
    assert sympy_equal(gold, answer) is equal
    assert is_equiv(gold, answer, use_math_verify=False) is equal


def test_unparseable_answers_are_wrong_not_errors() -> None:
    assert compute_score(r"\boxed{\frac{}{}}", "1") == 0.0
    assert compute_score(r"\boxed{)(}", "1") == 0.0
    assert compute_score(r"\boxed{)(}", "1", use_math_verify=False) == 0.0
    assert compute_score(r"\boxed{\begin{pmatrix}}", r"\sqrt{}") == 0.0


def test_pathological_input_returns_within_the_time_limit() -> None:
    compute_score(r"\boxed{1}", "2")  # start the checker, so its start-up is not timed
    start = time.monotonic()
    assert compute_score(r"\boxed{9^{9^{9^9}}}", "1", timeout_s=1.0) == 0.0
    assert time.monotonic() - start < 2.0
    # the checker was killed and restarts: the next answer is still checked
    assert compute_score(r"\boxed{0.5}", r"\frac{1}{2}") == 1.0
    assert compute_score(r"\boxed{2^{10^{12}}}", "1", timeout_s=1.0) == 0.0  # a memory bomb too


def test_works_outside_the_main_thread() -> None:
    # math-verify's own (signal) timeout refuses threads; the helper process does not care
    results: list[float] = []
    worker = threading.Thread(target=lambda: results.append(compute_score(r"\boxed{0.5}", r"\frac{1}{2}")))
    worker.start()
    worker.join()
    assert results == [1.0]


def test_sympy_fallback_without_latex2sympy_parses_simple_latex_and_never_runs_code(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "latex2sympy2_extended", None)  # `import` now raises ImportError
    monkeypatch.chdir(tmp_path)
    assert sympy_equal(r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2")
    assert sympy_equal(r"\dfrac{1}{2}", "0.5")
    assert sympy_equal("2xy", "yx2")  # a run of letters is a product of variables
    assert not sympy_equal(r"\pi", "3.14159")
    # parse_expr evaluates Python: what could be code is refused, and no name reaches it whole
    for code in ("open('pwned', 'w')", "__import__('os').system('touch pwned')"):
        with pytest.raises(ValueError, match="cannot parse"):
            sympy_equal("1", code)
    assert not sympy_equal("1", "exec(chr(1))")  # e*x*e*c(c*h*r(1)): letters, not a call to exec
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(ValueError, match="unbalanced"):
        sympy_equal("1", r"\frac{1}{")


def test_a_checker_that_cannot_start_is_an_error_not_a_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    from queryrl.rewards.scorers import math as math_reward

    monkeypatch.setattr(math_reward, "_worker", math_reward._Worker())  # a fresh one, not yet started
    monkeypatch.setattr(sys, "executable", shutil.which("false"))
    with pytest.raises(RuntimeError, match="did not start"):
        compute_score(r"\boxed{0.5}", r"\frac{1}{2}")
    assert compute_score(r"\boxed{1/2}", r"\frac{1}{2}") == 1.0  # the string compare needs no checker
