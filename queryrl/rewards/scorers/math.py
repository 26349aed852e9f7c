"""MATH answer scoring: the last ``\\boxed{}`` in the response, compared with the reference.

Semantics follow verl's ``verl/utils/reward_score/math.py`` (Hendrycks et al., "Measuring
Mathematical Problem Solving With the MATH Dataset", NeurIPS 2021, arXiv:2103.03874) with
a symbolic check added after verl's string compare:

1. The answer is the last ``\\boxed{...}`` / ``\\fbox{...}`` (balanced braces) or ``\\boxed 5``;
   a response without one scores 0.
2. Both answers are normalised (:func:`normalize_answer`, verl's ``strip_string`` made
   principled) and compared as strings.
3. If they differ, math-verify decides (``verify(gold, answer)``, gold first); when math-verify
   is not installed or cannot parse either side, sympy does (``simplify(a - b) == 0``; two plain
   numbers are compared with a relative tolerance of 1e-6 when either is a decimal).

Choices, made on purpose:

- ``10\\%`` equals ``10`` (verl strips ``\\%``) and also ``0.1`` (math-verify reads it as 10/100), either way
  round.
- ``1.2345678`` equals ``1.2345679``: two decimals that agree within a relative 1e-6 are the same answer
  (math-verify rounds to 6 places too); ``1.2346`` does not equal ``1.2345``.
- ``(3,4)`` equals ``3,4`` either way round: math-verify reads a parenthesised pair and a list of two
  solutions alike, and queryrl keeps its reading (a point and two solutions are not told apart).
- ``x=5`` equals ``5``: a left-hand side of at most two characters is dropped (verl), and
  math-verify compares an equation's right-hand side with a number.
- ``1,000`` equals ``1000``: commas between groups of three digits are thousands separators;
  ``1,2`` (two solutions) is left alone.
- ``\\pi`` does not equal ``3.14159``: the tolerance is for two decimals, not for a constant
  against its decimal expansion (math-verify rounds to 6 places: 3.141593 != 3.14159).
- verl's ``"0.5" -> "\\frac{1}{2}"`` special case is dropped: the symbolic check covers it.

The symbolic check runs in a helper process with a time limit (``timeout_s``) and a memory cap;
on a hang it is killed and restarted, and the answer counts as wrong. A signal-based timeout
(math-verify's own) would not do: it works only in the main thread, cannot interrupt a long
C-level computation such as ``9^{9^{9^9}}``, and does nothing about memory. The helper loads this
file by path, so this module imports only the standard library at the top.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

logger = logging.getLogger(__name__)

_BOXED = re.compile(r"\\(?:boxed|fbox)(?![A-Za-z])")
_WORKER_MEMORY_MB = 2048
_WORKER_START_TIMEOUT_S = 60.0
_FLOAT_REL_TOL = 1e-6


def last_boxed_only_string(text: str) -> str | None:
    """The last ``\\boxed{...}`` or ``\\fbox{...}`` in `text` (braces balanced), or ``\\boxed X``.

    ``\\boxed 5`` (a space, no brace) takes the rest of the line up to a ``$``. Returns None when
    there is no box, or the last one is not closed (a truncated response). Unlike verl, a
    ``\\boxed `` early in the text does not beat a later ``\\boxed{}``: the last box wins.
    """
    starts = [m.start() for m in _BOXED.finditer(text)]
    if not starts:
        return None
    start = starts[-1]
    head = _BOXED.match(text, start)
    assert head is not None
    i = head.end()
    if i < len(text) and text[i] == " " and not text[i:].lstrip(" ").startswith("{"):
        rest = text[i:].split("$")[0].split("\n")[0].strip()
        return text[start:i] + " " + rest if rest else None
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[start : j + 1]
    return None


def remove_boxed(s: str) -> str:
    """The content of ``\\boxed{X}`` / ``\\fbox{X}`` / ``\\boxed X``: ``X``.

    Raises:
        ValueError: `s` is not one of those forms (see :func:`last_boxed_only_string`).
    """
    head = _BOXED.match(s)
    if head is not None:
        rest = s[head.end() :]
        if rest.lstrip(" ").startswith("{") and s.endswith("}"):
            return rest.lstrip(" ")[1:-1]
        if rest.startswith(" "):
            return rest.strip()
    raise ValueError(f"not a boxed answer: {s[:80]!r}")


def extract_answer(text: str) -> str | None:
    """The content of the last box in `text`, or None when there is none."""
    boxed = last_boxed_only_string(text)
    return None if boxed is None else remove_boxed(boxed)


# ---- string normalisation (verl's strip_string, minus its accidents) ----

_SPACING = re.compile(r"\\[!,;: ]")
_LEFT_RIGHT = re.compile(r"\\(?:left|right)(?![A-Za-z])")
_UNITS = re.compile(r"\\(?:text|mbox)\{\s[^{}]*\}\s*$")  # "\text{ cm}": a unit (verl's rule)
_TEXT = re.compile(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}")
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_INT_SLASH_INT = re.compile(r"(-?\d+)/(\d+)")
_SQRT_BARE = re.compile(r"\\sqrt(?![A-Za-z{\[])(\S)")


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``, ``\\frac{1}2`` -> ``\\frac{1}{2}``."""
    parts = s.split("\\frac")
    out = parts[0]
    for part in parts[1:]:
        out += "\\frac"
        args: list[str] = []
        rest = part
        for _ in range(2):
            if rest.startswith("{"):
                depth, end = 0, -1
                for k, c in enumerate(rest):
                    depth += (c == "{") - (c == "}")
                    if depth == 0:
                        end = k
                        break
                if end < 0:
                    break
                args.append(rest[: end + 1])
                rest = rest[end + 1 :]
            elif rest:
                args.append("{" + rest[0] + "}")
                rest = rest[1:]
        out += "".join(args) + rest
    return out


def normalize_answer(answer: str) -> str:
    """A canonical spelling of `answer`, for the string compare (verl's ``strip_string``).

    Drops what is only notation: line breaks, spacing commands, spaces, ``\\left``/``\\right``,
    degrees, ``$``, a trailing unit ``\\text{ cm}``, ``\\text{}`` wrappers, ``\\%``, a trailing
    full stop, thousands separators and a short left-hand side (``x=``); writes ``\\dfrac`` and
    ``\\tfrac`` as ``\\frac``, ``\\frac12`` as ``\\frac{1}{2}``, ``\\sqrt3`` as ``\\sqrt{3}``,
    ``3/4`` as ``\\frac{3}{4}`` and ``.5`` as ``0.5``. Never changes a value.
    """
    s = answer.replace("\n", "").strip()
    s = s.replace("\\\\", "\\")
    s = _SPACING.sub("", s)
    s = s.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    s = _LEFT_RIGHT.sub("", s)
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    s = _UNITS.sub("", s)
    s = _TEXT.sub(r"\1", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip().rstrip(".").strip()
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    if s.startswith("-."):
        s = "-0" + s[1:]
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0].strip()) <= 2:
        s = sides[1]
    s = _SQRT_BARE.sub(r"\\sqrt{\1}", s)
    s = s.replace(" ", "")
    s = _fix_fracs(s)
    if _THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    m = _INT_SLASH_INT.fullmatch(s)
    if m:
        s = f"\\frac{{{m.group(1)}}}{{{m.group(2)}}}"
    return s


# ---- the symbolic check (runs in the helper process) ----


# What the plain-text parser may see: numbers, one-letter variables, pi, sqrt, operators. Nothing
# else reaches parse_expr, which evaluates its input as Python.
_SAFE_PLAIN = re.compile(r"(?:\d+\.?\d*|\.\d+|sqrt|pi|[A-Za-z](?![A-Za-z])|[\s+\-*/()])*")


def _brace_group_end(s: str, i: int) -> int:
    """The index just past the ``{...}`` group that starts at ``s[i]``; -1 if unbalanced."""
    depth = 0
    for j in range(i, len(s)):
        depth += (s[j] == "{") - (s[j] == "}")
        if depth == 0:
            return j + 1
    return -1


def _plain(latex: str) -> str:
    """A few LaTeX forms as plain text: ``\\frac{a}{b}`` -> ``((a)/(b))``, ``\\sqrt{x}`` -> ``sqrt(x)``."""
    s = _fix_fracs(latex.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac"))
    while (i := s.find("\\frac{")) >= 0:
        mid = _brace_group_end(s, i + 5)
        end = _brace_group_end(s, mid) if 0 <= mid < len(s) and s[mid] == "{" else -1
        if end < 0:
            raise ValueError(f"unbalanced \\frac in {latex!r}")
        s = f"{s[:i]}(({s[i + 6 : mid - 1]})/({s[mid + 1 : end - 1]})){s[end:]}"
    s = s.replace("\\sqrt", "sqrt").replace("\\pi", "pi").replace("\\cdot", "*").replace("\\times", "*")
    # a run of letters is a product of one-letter variables ("xy" -> "x*y"), so no name is ever
    # a Python builtin ("exec" -> "e*x*e*c")
    s = re.sub(r"[A-Za-z]+", lambda m: m[0] if m[0] in ("sqrt", "pi") else "*".join(m[0]), s)
    return s.replace("^", "**").replace("{", "(").replace("}", ")")


def _parse_sympy(answer: str) -> Any:
    """`answer` as a sympy object: with latex2sympy2_extended if installed, else (simple
    expressions only) with sympy's ``parse_expr`` on :func:`_plain` of it."""
    try:
        from latex2sympy2_extended import latex2sympy

        return latex2sympy(answer)
    except ImportError:
        pass
    plain = _plain(answer)
    if not _SAFE_PLAIN.fullmatch(plain):
        raise ValueError(f"cannot parse {answer!r} without latex2sympy2_extended")
    from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

    return parse_expr(plain, transformations=(*standard_transformations, implicit_multiplication_application))


def sympy_equal(gold: str, answer: str) -> bool:
    """Symbolic equality with sympy alone (the fallback when math-verify cannot decide).

    Two numbers: exact when both are exact, within a relative 1e-6 when either is a decimal.
    Expressions: ``simplify(gold - answer) == 0``. Anything else (sets, equations): ``==``.
    Raises whatever the parser raises; :func:`symbolic_equal` turns that into "not equal".
    """
    import sympy

    a, b = _parse_sympy(gold), _parse_sympy(answer)
    if isinstance(a, sympy.Number) and isinstance(b, sympy.Number):
        if isinstance(a, sympy.Float) or isinstance(b, sympy.Float):
            return math.isclose(float(a), float(b), rel_tol=_FLOAT_REL_TOL, abs_tol=1e-12)
        return bool(a == b)
    if isinstance(a, sympy.Expr) and isinstance(b, sympy.Expr):
        return bool(sympy.simplify(a - b) == 0)
    return bool(a == b)


def symbolic_equal(gold: str, answer: str, use_math_verify: bool = True) -> tuple[bool, str]:
    """``(equal, how)``: math-verify's verdict, or sympy's when math-verify is missing or fails.

    Runs in-process without a time limit: call it through :func:`compute_score` (or the helper
    process) unless the input is trusted. Never raises: a parser error means "not equal".
    """
    if use_math_verify:
        try:
            from math_verify import parse, verify

            # no signal-based timeouts: the helper process is killed from outside instead
            parsed_gold = parse(f"${gold}$", parsing_timeout=None)
            parsed = parse(f"${answer}$", parsing_timeout=None)
            if parsed_gold and parsed:
                return bool(verify(parsed_gold, parsed, timeout_seconds=None)), "math_verify"
        except Exception:
            pass  # not installed or failed on this input: sympy decides
    try:
        return sympy_equal(gold, answer), "sympy"
    except Exception:
        return False, "error"


def _serve() -> None:
    """The helper process: one JSON request per line on stdin, one JSON reply per line on stdout."""
    import logging as _logging
    import resource
    import signal
    import warnings

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the trainer; we exit on EOF
    _logging.disable(_logging.WARNING)  # math-verify warns on every call without its timeout
    warnings.simplefilter("ignore")  # stderr is not read after start-up
    with contextlib.suppress(ImportError):
        import math_verify  # noqa: F401  (imported now, so the first request is not slow)
    import sympy  # noqa: F401

    memory_mb = int(sys.argv[2]) if len(sys.argv) > 2 else _WORKER_MEMORY_MB
    limit = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            equal, how = symbolic_equal(request["gold"], request["answer"], request.get("use_math_verify", True))
        except BaseException as e:  # MemoryError, RecursionError: this answer is wrong, go on
            equal, how = False, type(e).__name__
        sys.stdout.write(json.dumps({"equal": equal, "how": how}) + "\n")
        sys.stdout.flush()


_BOOT = (
    "import importlib.util as u, sys\n"
    "s = u.spec_from_file_location('queryrl_math_worker', sys.argv[1])\n"
    "m = u.module_from_spec(s); sys.modules[s.name] = m; s.loader.exec_module(m); m._serve()\n"
)


class _Worker:
    """The helper process: started on first use, killed and restarted after a timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = 0  # the process that started it: a forked child starts its own
        atexit.register(self.close)

    def _start(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-P", "-c", _BOOT, os.path.abspath(__file__), str(_WORKER_MEMORY_MB)]
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors)
            assert proc.stdout is not None
            if _read_line(proc.stdout.fileno(), time.monotonic() + _WORKER_START_TIMEOUT_S) == "ready":
                self._pid = os.getpid()
                return proc  # its stderr stays open (the file is unlinked): nothing is written after start-up
            proc.kill()
            proc.wait()
            errors.seek(0)
            tail = errors.read().decode(errors="replace")[-2000:]
        # loud, not a silent 0: a reward that can never be right must not train the policy
        raise RuntimeError(f"the math answer checker did not start (is sympy installed?): {tail}")

    def check(self, gold: str, answer: str, timeout_s: float, use_math_verify: bool) -> bool:
        """Equal per :func:`symbolic_equal`; False on a timeout (the helper is then restarted).

        Raises:
            RuntimeError: the helper cannot start (the sample fails, visibly, instead of scoring 0).
        """
        with self._lock:
            if self._proc is not None and (self._pid != os.getpid() or self._proc.poll() is not None):
                self._proc = None  # forked from the owner, or it died: start another
            if self._proc is None:
                self._proc = self._start()
            proc = self._proc
            assert proc.stdin is not None
            assert proc.stdout is not None
            request = {"gold": gold, "answer": answer, "use_math_verify": use_math_verify}
            try:
                proc.stdin.write((json.dumps(request) + "\n").encode())
                proc.stdin.flush()
            except OSError:
                self._kill()
                return False
            reply = _read_line(proc.stdout.fileno(), time.monotonic() + timeout_s)
            if reply is None:
                self._kill()
                return False
            return bool(json.loads(reply).get("equal", False))

    def _kill(self) -> None:
        if self._proc is not None and self._pid == os.getpid():
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def close(self) -> None:
        with self._lock:
            self._kill()


def _read_line(fd: int, deadline: float) -> str | None:
    """One line from `fd` (without its newline), or None on EOF or when `deadline` passes."""
    poller = select.poll()  # not select.select: a trainer may hold more than 1024 file descriptors
    poller.register(fd, select.POLLIN)
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return None
        data += chunk
    return data.decode().strip()


_worker = _Worker()


def is_equiv(gold: str, answer: str, timeout_s: float = 1.0, use_math_verify: bool = True) -> bool:
    """Whether `answer` equals `gold`: normalised strings first, then the symbolic check.

    Args:
        gold: the reference answer (the box content, not the whole solution).
        answer: the model's answer.
        timeout_s: the time limit of the symbolic check; past it the answer counts as wrong.
        use_math_verify: False to use sympy alone.
    """
    try:
        if normalize_answer(gold) == normalize_answer(answer):
            return True
    except Exception:
        pass  # a normaliser bug must not crash the trainer; the symbolic check still runs
    return _worker.check(gold, answer, timeout_s, use_math_verify)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    timeout_s: float = 1.0,
    use_math_verify: bool = True,
) -> float:
    """MATH reward: 1.0 when the last boxed answer equals `ground_truth`, else 0.0.

    Args:
        solution_str: the model's response.
        ground_truth: the reference answer, e.g. ``"\\frac{1}{2}"``; a whole solution with a
            ``\\boxed{}`` is reduced to its box; a number is compared as its string.
        timeout_s: see :func:`is_equiv`.
        use_math_verify: see :func:`is_equiv`.
    """
    answer = extract_answer(solution_str)
    if answer is None or not answer.strip():  # an empty box is no answer
        return 0.0
    gold = ground_truth if isinstance(ground_truth, str) else str(ground_truth)
    gold = extract_answer(gold) or gold
    return 1.0 if is_equiv(gold, answer, timeout_s=timeout_s, use_math_verify=use_math_verify) else 0.0
