"""The code reward cannot be forged: every known attack as one line of :data:`CASES` (issue 26 item 2, issue
52 items 1 and 5). Each is (solution, tests, expected score); a new hole is one line more.

The verdict is computed in a process that never runs the model's code (queryrl/rewards/scorers/code_rpc.py),
and the tests see the real builtins and modules whatever the solution defines. Every attack below scored 1.0
on some earlier version; each control (expected 1.0) shows that an honest solution of the same shape still
passes.
"""

from __future__ import annotations

import logging
import textwrap

import pytest

from queryrl.rewards.scorers.code import compute_score, namespaces_available

pytestmark = pytest.mark.skipif(not namespaces_available(), reason="no isolation works here (runs are refused)")
TESTS = "assert f(1) == 2\nassert f(2) == 4\nassert f(3) == 6"
AREA = "assert abs(area(2) - 12.566) < 1e-3"
AREA_MATH = "assert math.isclose(area(2), 12.566, rel_tol=1e-3)"  # `math` is not imported by the tests
WRONG_AREA = "def area(r):\n    return 0\n"
# HumanEval/2's tests, verbatim
HUMANEVAL_2 = """

METADATA = {
    'author': 'jt',
    'dataset': 'test'
}


def check(candidate):
    assert candidate(3.5) == 0.5
    assert abs(candidate(1.33) - 0.33) < 1e-6
    assert abs(candidate(123.456) - 0.456) < 1e-6

check(truncate_number)
"""
IS_EVEN = "assert all(map(is_even, [2, 4, 6]))\nassert not is_even(3)"


def _forged_server(answer_call: str) -> str:
    """A solution that replaces the sandbox's serving loop (found through its caller's frame) by one that
    says `is_even` is a function and answers each call with `answer_call` (a JSON reply without its id)."""
    return textwrap.dedent(
        f"""
        import json, os, sys
        def is_even(n):
            return False
        def serve(module, reply_fd):
            out = os.fdopen(reply_fd, "wb", buffering=0)
            for line in sys.stdin.buffer:
                request = json.loads(line)
                reply = {{"names": {{"ok": {{"l": [{{"l": ["is_even", None]}}]}}}},
                         "get": {{"ok": {{"h": [1, "function", True]}}}}}}.get(request["op"], {answer_call})
                out.write(json.dumps({{"id": request["id"], **reply}}).encode() + b"\\n")
        sys._getframe(1).f_globals["_serve"] = serve
        """
    )


CASES = [
    # ---- issue 26: the verdict is not in the solution's process ----
    # the old runner kept its nonce in a caller's frame and reported on a dup of stdout
    pytest.param("""
        import gc, os, sys
        words = set()
        frame = sys._getframe()
        while frame is not None:
            words |= {v for v in frame.f_locals.values() if isinstance(v, str)}
            frame = frame.f_back
        words |= {o for o in gc.get_objects() if isinstance(o, str) and len(o) == 32}
        for fd in range(3, 64):
            for word in list(words)[:50] + [""]:
                for i in range(3):
                    try:
                        os.write(fd, f"\\n{word} {i} pass\\n".encode())
                    except OSError:
                        break
        def f(x):
            return 0
    """, TESTS, 0.0, id="frames and every descriptor"),
    # the old runner's nonce was the first line of stdin, still there to seek back to
    pytest.param("""
        import os, sys
        os.lseek(0, 0, 0)
        seen = sys.stdin.read(4096)
        for i in range(3):
            print(f"{seen.strip()} {i} pass")
        def f(x):
            return 0
    """, TESTS, 0.0, id="stdin rewound"),
    pytest.param("import sys\ndef f(x):\n    return 0\nsys.exit(0)", TESTS, 0.0, id="exit before the tests"),
    pytest.param("import os\ndef f(x):\n    return 0\nos._exit(0)", TESTS, 0.0, id="os._exit before the tests"),
    pytest.param("""
        import builtins
        class Never(Exception):
            pass
        builtins.AssertionError = Never
        def f(x):
            return 0
    """, TESTS, 0.0, id="assert and AssertionError monkeypatched"),
    pytest.param("""
        for i in range(3):
            print(f"{i} pass")
            print(f"x {i} pass")
        def f(x):
            return 0
    """, TESTS, 0.0, id="fake pass lines printed"),
    pytest.param("""
        class Anything:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        def f(x):
            return Anything()
    """, TESTS, 0.0, id="an object equal to everything"),
    pytest.param("""
        class Two(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def f(x):
            return Two(0)
    """, TESTS, 0.0, id="an int subclass equal to everything"),
    # answering the evaluator's requests itself, on the descriptor the replies go to, with guesses
    pytest.param("""
        import json, os, sys, threading
        def answer():
            for line in sys.stdin:
                request = json.loads(line)
                for fd in range(3, 64):
                    try:
                        os.write(fd, (json.dumps({"id": request["id"], "ok": 1}) + "\\n").encode())
                    except OSError:
                        pass
        threading.Thread(target=answer, daemon=True).start()
        def f(x):
            return 0
    """, TESTS, 0.0, id="forged replies"),
    pytest.param("""
        class Anything:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        def f(x):
            return Anything()
    """, "def check(candidate):\n    assert candidate(1) == 2\n\ncheck(f)", 0.0, id="HumanEval check, always equal"),
    # ---- issue 52: the tests see the real builtins and modules ----
    pytest.param(WRONG_AREA + "abs = lambda x: 0", AREA, 0.0, id="abs rebound"),
    pytest.param(WRONG_AREA + "def round(x, n=0):\n    return 12.566", "assert round(area(2), 3) == 12.566", 0.0,
                 id="round rebound"),
    pytest.param("def dedupe(xs):\n    return [0]\nset = lambda xs: {1, 3}", "assert set(dedupe([3, 1, 3])) == {1, 3}",
                 0.0, id="set rebound"),
    pytest.param("def f(x):\n    return []\nlen = lambda x: 3", "assert len(f(3)) == 3", 0.0, id="len rebound"),
    pytest.param(WRONG_AREA + "class math:\n    isclose = staticmethod(lambda *a, **k: True)", AREA_MATH, 0.0,
                 id="a class math the tests do not import"),
    pytest.param("import math\nmath.isclose = lambda *a, **k: True\n" + WRONG_AREA, AREA_MATH, 0.0,
                 id="the real math patched in the sandbox"),
    pytest.param("import numpy as np\nnp.allclose = lambda *a, **k: True\n" + WRONG_AREA,
                 "assert np.allclose(area(2), 12.566, rtol=1e-3)", 0.0, id="numpy patched under an alias"),
    pytest.param("def truncate_number(number):\n    return 0.5\nabs = lambda x: 0", HUMANEVAL_2, 0.0,
                 id="HumanEval/2 with abs rebound"),
    # ---- issue 52: a control-flow exception of the solution is its error ----
    pytest.param("def is_even(n):\n    raise StopIteration", IS_EVEN, 0.0, id="StopIteration ends map early"),
    pytest.param("def is_even(n):\n    raise StopAsyncIteration", IS_EVEN, 0.0, id="StopAsyncIteration"),
    pytest.param(_forged_server('{"err": ["StopIteration", ""]}'), IS_EVEN, 0.0, id="served err StopIteration"),
    pytest.param(_forged_server('{"stop": True}'), IS_EVEN, 0.0, id="served stop for a call"),
    pytest.param(_forged_server('{"err": ["GeneratorExit", ""]}'), IS_EVEN, 0.0, id="served err GeneratorExit"),
    # ---- controls: honest solutions of the same shapes still pass ----
    pytest.param("def f(x):\n    return 2 * x", TESTS, 1.0, id="control: correct f"),
    pytest.param("def area(r):\n    return 3.1415 * r * r", AREA, 1.0, id="control: correct area, real abs"),
    pytest.param("import math\ndef area(r):\n    return math.pi * r * r", AREA_MATH, 1.0,
                 id="control: tests use the solution's import math"),
    pytest.param("import numpy as np\ndef area(r):\n    return np.pi * r * r",
                 "assert np.allclose(area(2), 12.566, rtol=1e-3)", 1.0, id="control: numpy under an alias"),
    pytest.param("def truncate_number(number: float) -> float:\n    return number % 1.0", HUMANEVAL_2, 1.0,
                 id="control: HumanEval/2"),
    pytest.param("def is_even(n):\n    return n % 2 == 0", IS_EVEN, 1.0, id="control: is_even"),
    pytest.param("import sys\ninput = sys.stdin.readline\ndef f(x):\n    return 2 * x", TESTS, 1.0,
                 id="control: a builtin rebound that the tests do not use"),
    pytest.param("max = 5\ndef f(x):\n    return 2 * x", "max = f(1)\nassert max == 2", 1.0,
                 id="control: a builtin the tests bind themselves"),
    pytest.param("def f(x):\n    return 2 * x", "def check(f):\n    assert f(2) == 4\n\ncheck(f)", 1.0,
                 id="control: a parameter named as the solution's function"),
    pytest.param("def bisect(xs, x):\n    return sum(1 for v in xs if v < x)", "assert bisect([1, 3], 2) == 1", 1.0,
                 id="control: a function named as a module, called by the tests"),
    pytest.param("def chunk(xs):\n    return [xs]",
                 "def check(candidate):\n    assert candidate([1]) == [[1]]\n\ncheck(chunk)", 1.0,
                 id="control: a function named as a module, passed to check"),
]  # fmt: skip


@pytest.mark.parametrize(("solution", "tests", "expected"), CASES)
def test_the_code_reward_cannot_be_forged(solution: str, tests: str, expected: float) -> None:
    response = f"```python\n{textwrap.dedent(solution).strip()}\n```"
    assert compute_score("code", response, tests) == expected


def test_a_rebound_builtin_fails_every_test_with_a_reason(caplog: pytest.LogCaptureFixture) -> None:
    # a correct solution too: the tests cannot tell its `abs` from a forged one
    solution = "```python\ndef area(r):\n    return 3.1415 * r * r\ndef abs(x):\n    return x if x > 0 else -x\n```"
    with caplog.at_level(logging.DEBUG, logger="queryrl.rewards.scorers.code_rpc"):
        assert compute_score("code", solution, AREA + "\nassert area(1) > 3") == 0.0
    assert "the solution rebinds `abs`, a builtin, which the tests use" in caplog.text


def test_honest_solutions_still_pass_through_the_proxy() -> None:
    def score(solution: str, tests: str = TESTS) -> float:
        return compute_score("code", f"```python\n{solution}\n```", tests)

    assert score("def f(x):\n    return 2 * x if x < 3 else 0") == pytest.approx(2 / 3)
    # types cross exactly: a tuple is not a list, 2.0 equals 2, inf and nan survive
    assert score("def f(x):\n    return (x, x)", "assert f(1) == (1, 1)\nassert f(1) != [1, 1]") == 1.0
    floats = "assert f(1) == 2\nassert f(0) == float('inf')\nimport math\nassert math.isnan(f(-1))"
    assert (
        score("def f(x):\n    return 2.0 * x if x > 0 else (float('inf') if x == 0 else float('nan'))", floats) == 1.0
    )
    # the solution's exceptions reach the test as the same built-in type
    raises = "try:\n    f(-1)\n    raise AssertionError\nexcept ValueError:\n    pass\nassert f(2) == 4"
    assert score("def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return 2 * x", raises) == 1.0


def test_classes_generators_and_constants_of_the_solution() -> None:
    solution = """
        LIMIT = 7
        class Stack:
            def __init__(self):
                self.items = []
            def push(self, x):
                self.items.append(x)
            def pop(self):
                return self.items.pop()
            def __len__(self):
                return len(self.items)
        def evens(n):
            return (i for i in range(n) if i % 2 == 0)
    """
    tests = textwrap.dedent(
        """
        s = Stack()
        s.push(1)
        s.push(2)
        assert len(s) == 2
        assert s.pop() == 2
        assert s.items == [1]
        assert list(evens(7)) == [0, 2, 4, 6]
        assert LIMIT == 7
        assert s == s and s != Stack()
        """
    )
    assert compute_score("code", f"```python\n{textwrap.dedent(solution)}\n```", tests) == 1.0
