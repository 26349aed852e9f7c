"""Assert tests cannot be forged (issue 26 item 2): the verdict is computed in a process that never runs
the model's code (queryrl/rewards/scorers/code_rpc.py). Each "solution" below defines no working `f`; before
this design the first two scored 1.0."""

from __future__ import annotations

import textwrap

import pytest

from queryrl.rewards.scorers.code import compute_score, namespaces_available

pytestmark = pytest.mark.skipif(not namespaces_available(), reason="no isolation works here (runs are refused)")
TESTS = "assert f(1) == 2\nassert f(2) == 4\nassert f(3) == 6"


def _score(solution: str, tests: str = TESTS) -> float:
    return compute_score("code", f"```python\n{textwrap.dedent(solution)}\n```", tests)


ATTACKS = {
    # the old runner kept its nonce in a caller's frame and reported on a dup of stdout
    "frames and every descriptor": """
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
    """,
    # the old runner's nonce was the first line of stdin, still there to seek back to
    "stdin rewound": """
        import os, sys
        os.lseek(0, 0, 0)
        seen = sys.stdin.read(4096)
        for i in range(3):
            print(f"{seen.strip()} {i} pass")
        def f(x):
            return 0
    """,
    "exit before the tests": """
        import sys
        def f(x):
            return 0
        sys.exit(0)
    """,
    "os._exit before the tests": """
        import os
        def f(x):
            return 0
        os._exit(0)
    """,
    "assert and AssertionError monkeypatched": """
        import builtins
        class Never(Exception):
            pass
        builtins.AssertionError = Never
        def f(x):
            return 0
    """,
    "fake pass lines printed": """
        for i in range(3):
            print(f"{i} pass")
            print(f"x {i} pass")
        def f(x):
            return 0
    """,
    "an object equal to everything": """
        class Anything:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__
        def f(x):
            return Anything()
    """,
    "an int subclass equal to everything": """
        class Two(int):
            def __eq__(self, other):
                return True
            __hash__ = int.__hash__
        def f(x):
            return Two(0)
    """,
    # answering the evaluator's requests itself, on the descriptor the replies go to, with guesses
    "forged replies": """
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
    """,
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_forged_pass_scores_zero(attack: str) -> None:
    assert _score(ATTACKS[attack]) == 0.0


def test_honest_solutions_still_pass_through_the_proxy() -> None:
    assert _score("def f(x):\n    return 2 * x") == 1.0
    assert _score("def f(x):\n    return 2 * x if x < 3 else 0") == pytest.approx(2 / 3)
    # types cross exactly: a tuple is not a list, 2.0 equals 2, inf and nan survive
    assert _score("def f(x):\n    return (x, x)", "assert f(1) == (1, 1)\nassert f(1) != [1, 1]") == 1.0
    floats = "assert f(1) == 2\nassert f(0) == float('inf')\nimport math\nassert math.isnan(f(-1))"
    assert (
        _score("def f(x):\n    return 2.0 * x if x > 0 else (float('inf') if x == 0 else float('nan'))", floats) == 1.0
    )
    # the solution's exceptions reach the test as the same built-in type
    raises = "try:\n    f(-1)\n    raise AssertionError\nexcept ValueError:\n    pass\nassert f(2) == 4"
    assert _score("def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return 2 * x", raises) == 1.0


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
    assert _score(solution, tests) == 1.0


def test_humaneval_check_gets_a_proxy_candidate() -> None:
    tests = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(5) == 10\n\ncheck(f)"
    assert _score("def f(x):\n    return 2 * x", tests) == 1.0
    assert _score(ATTACKS["an object equal to everything"], tests) == 0.0
