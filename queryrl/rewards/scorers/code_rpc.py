"""Assert tests whose verdict the model's code cannot forge: the tests run in another process.

The model's code (the *solution*) runs in the sandbox (:mod:`queryrl.rewards.scorers.code`) and then serves
requests; the tests run in an *evaluator* process that never runs the solution's code. A test such as
``assert f(3) == 9`` calls ``f`` through a proxy: the evaluator sends ``f``'s name and the arguments (data
only) to the sandbox, the sandbox calls the function and sends back the result as data, and the
evaluator compares it with ``9``. Nothing that marks a pass exists in the solution's process: no nonce, no
report line, no expected value (the tests' source stays in the evaluator). So exiting before the tests,
``os._exit(0)``, printing fake report lines, reading stdin, frames or descriptors, monkeypatching
``assert`` or ``AssertionError``: all fail the tests, since the evaluator only ever sees data the solution
returned, and the only data that passes is the right answer.

The tests see the real builtins and modules whatever the solution defines: their globals hold the
evaluator's builtins and, of the solution's names, only those the tests read without binding them
themselves. A solution whose value for such a name is not the builtin of that name (``abs = lambda x: 0``),
or not the module of that name where the tests use it as one (``math.isclose`` with a ``class math``), fails
every test, with a reason in the debug log: the tests cannot tell a replaced builtin from a forged one. A
module the solution imported (``import math``; ``import numpy as np``) is imported again by the evaluator,
so an attribute the solution patched stays in the sandbox. An exception of the solution that steers the
tests' control flow (``StopIteration``, which ends a ``map`` early; ``SystemExit``, ``GeneratorExit``...),
or a reply ending an iteration nobody asked for, is a failed call.

Values cross as tagged JSON of exact built-in types (``None``, ``bool``, ``int``, ``float`` with inf and
NaN, ``str``, ``bytes``, ``complex``, ``list``, ``tuple``, ``dict``, ``set``, ``frozenset``). Anything
else (an instance of the solution's class, a function, an iterator, a subclass of a built-in type) stays
in the sandbox and is handed to the evaluator as a *handle*: the evaluator can call it, read its
attributes, iterate it, take its ``len`` or index it, each through the sandbox; a handle equals only
itself. So an object whose ``__eq__`` always says True (the classic forgery of an assert grader) never
equals an expected value here.

What this design cannot do or stop (each a failed test, never a forged pass):

- tests that check a mutation of their own arguments in place (``xs = [3, 1]; sort_in_place(xs); assert
  xs == [1, 3]``): the sandbox mutated a copy;
- passing a function or another non-data value to the solution (``apply(f, lambda x: x + 1)``);
- comparing two of the solution's objects with each other (``assert Point(1, 2) == Point(1, 2)``);
- a task whose function has a builtin's name (``def sum``), or a module's name that the tests use as
  ``name.attribute``: every solution fails it;
- tests that read a name they neither define nor import, expecting an object the solution makes (not a
  module) under it, trust the solution's object for it: write the imports the tests need into the tests.

The evaluator runs the tests' own code (the dataset's: trusted, not the model's) without the sandbox's
isolation, under the same CPU and memory limits. With ``isolation=none`` the solution runs unconfined
and can read the evaluator's files and memory like any other file of the trainer's user: that mode
protects nothing, as its warning says.
"""

from __future__ import annotations

import json
import logging
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)

MAX_REPLY_BYTES = 16 << 20  # one reply line; longer: that call fails
MAX_DEPTH = 64  # nesting of one value

# The tagged-JSON codec, in both processes. `keep(x)` turns a non-data value into a handle (sandbox side);
# `handle(obj)` turns a handle back into an object (the sandbox's table, or the evaluator's proxy).
CODEC = r"""
def _enc(x, keep, depth=0, type=type, repr=repr, len=len):
    t = type(x)
    if x is None or t is bool or t is int or t is str:
        return x
    if t is float:
        return {"f": repr(x)}
    if depth > __MAX_DEPTH__:
        return keep(x)
    if t is list or t is tuple or t is set or t is frozenset:
        tag = {list: "l", tuple: "t", set: "s", frozenset: "z"}[t]
        return {tag: [_enc(v, keep, depth + 1) for v in x]}
    if t is dict:
        return {"d": [[_enc(k, keep, depth + 1), _enc(v, keep, depth + 1)] for k, v in x.items()]}
    if t is bytes:
        return {"b": x.hex()}
    if t is complex:
        return {"c": [repr(x.real), repr(x.imag)]}
    return keep(x)
def _dec(o, handle, depth=0):
    t = type(o)
    if o is None or t is bool or t is int or t is str:
        return o
    if t is not dict or len(o) != 1 or depth > __MAX_DEPTH__:
        raise ValueError("not a value")
    (tag, v), = o.items()
    if tag == "f":
        return float(v)
    if tag in ("l", "t", "s", "z"):
        items = [_dec(i, handle, depth + 1) for i in v]
        return {"l": list, "t": tuple, "s": set, "z": frozenset}[tag](items)
    if tag == "d":
        return {_dec(k, handle, depth + 1): _dec(w, handle, depth + 1) for k, w in v}
    if tag == "b":
        return bytes.fromhex(v)
    if tag == "c":
        return complex(float(v[0]), float(v[1]))
    if tag == "h":
        return handle(v)
    raise ValueError("unknown tag %r" % (tag,))
""".replace("__MAX_DEPTH__", str(MAX_DEPTH))

# The sandbox's side (runner mode "serve"): the solution ran as __main__; now answer requests on stdin,
# replies on the descriptor `reply_fd`, until stdin ends. Nothing here is secret: whatever the solution
# makes this loop send is data it could have returned.
SERVE = (
    CODEC
    + r"""
def _serve(module, reply_fd):
    import builtins, json, sys, types
    table = {}
    def keep(x):
        table[len(table) + 1] = x
        return {"h": [len(table), type(x).__name__, callable(x)]}
    def obj(v):
        return table[v[0]]
    out = os.fdopen(reply_fd, "wb", buffering=0)
    for line in sys.stdin.buffer:
        request = json.loads(line)
        op = request["op"]
        try:
            if op == "names":  # each with a claim the evaluator checks: a module's name, or the builtin itself
                value = [[k, ("module:" + v.__name__) if isinstance(v, types.ModuleType) else
                          "builtin" if getattr(builtins, k, table) is v else None]
                         for k, v in list(module.__dict__.items()) if not k.startswith("__")]
            elif op == "get":
                value = module.__dict__[request["name"]]
            elif op == "call":
                args = [_dec(a, obj) for a in request["args"]]
                kwargs = {k: _dec(a, obj) for k, a in request["kwargs"]}
                value = table[request["h"]](*args, **kwargs)
            elif op == "getattr":
                value = getattr(table[request["h"]], request["name"])
            elif op == "iter":
                value = iter(table[request["h"]])
            elif op == "next":
                try:
                    value = next(table[request["h"]])
                except StopIteration:
                    out.write(json.dumps({"id": request["id"], "stop": True}).encode() + b"\n")
                    continue
            elif op == "len":
                value = len(table[request["h"]])
            elif op == "getitem":
                value = table[request["h"]][_dec(request["key"], obj)]
            else:
                raise ValueError("unknown request %r" % (op,))
            try:
                reply = {"id": request["id"], "ok": _enc(value, keep)}
            except RecursionError:
                reply = {"id": request["id"], "ok": keep(value)}
        except BaseException as e:  # SystemExit in a call too: that call failed
            reply = {"id": request["id"], "err": [type(e).__name__, str(e)[:500]]}
        out.write(json.dumps(reply).encode() + b"\n")
"""
)

# The evaluator: runs the tests (the dataset's code) with the solution's names as proxies; prints
# "<index> pass|fail" per counted test. argv: tests file, request fd, CPU seconds, memory bytes.
EVALUATOR = (
    CODEC
    + r"""
import ast, builtins, importlib, importlib.util, json, os, resource, symtable, sys, traceback
_ACTS_ON_IMPORT = {"antigravity", "this", "idlelib", "turtledemo"}  # a browser, a print, a window
_tests_path, _request_fd = sys.argv[1], int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_CPU, (int(sys.argv[3]), int(sys.argv[3]) + 1))
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[4]), int(sys.argv[4])))
with open(_tests_path, encoding="utf-8") as f:
    _tests = json.load(f)
_requests = os.fdopen(_request_fd, "wb", buffering=0)
_replies = sys.stdin.buffer
_LIMIT = __MAX_REPLY_BYTES__
_state = {"id": 0, "gone": None}

class SolutionGone(RuntimeError):
    pass

class RemoteError(Exception):
    pass

class _Exhausted(Exception):
    "The solution's iterator has no next item (never raised into the tests: Remote.__iter__ ends)."

_CONTROL_FLOW = (StopIteration, StopAsyncIteration)  # the other ones are not Exceptions: KeyboardInterrupt, ...

def _read_line():
    line = _replies.readline(_LIMIT + 1)
    if len(line) > _LIMIT and not line.endswith(b"\n"):
        while line and not line.endswith(b"\n"):
            line = _replies.readline(_LIMIT + 1)
        raise RemoteError("the solution's reply is over %d bytes" % _LIMIT)
    return line

def _ask(op, **fields):
    if _state["gone"]:
        raise SolutionGone(_state["gone"])
    _state["id"] += 1
    try:
        _requests.write(json.dumps({"id": _state["id"], "op": op, **fields}).encode() + b"\n")
    except OSError as e:
        _state["gone"] = "the solution's process ended (%s)" % e
        raise SolutionGone(_state["gone"]) from None
    while True:
        line = _read_line()
        if not line:
            _state["gone"] = "the solution's process ended"
            raise SolutionGone(_state["gone"])
        try:
            reply = json.loads(line)
        except ValueError:
            continue
        if type(reply) is dict and reply.get("id") == _state["id"]:
            break
    if "err" in reply:
        name, message = (list(reply["err"]) + ["", ""])[:2]
        kind = getattr(builtins, str(name), None)
        # a built-in exception as itself, but never one that steers the tests' own control flow (a
        # StopIteration raised in a function map() calls ends the map early: all() of it passes)
        if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, _CONTROL_FLOW):
            raise kind(str(message))
        raise RemoteError("%s: %s" % (name, message))
    if reply.get("stop"):
        if op != "next":
            raise RemoteError("the solution ended an iteration that was not asked for (%s)" % op)
        raise _Exhausted
    return _dec(reply["ok"], Remote)

class Remote:
    "One of the solution's objects, in the sandbox: every use is a request; it equals only itself."
    __slots__ = ("_h", "_type", "_callable")
    def __init__(self, v):
        self._h, self._type, self._callable = int(v[0]), str(v[1]), bool(v[2])
    def __call__(self, *args, **kwargs):
        return _ask("call", h=self._h, args=[_enc(a, _no_handle) for a in args],
                    kwargs=[[k, _enc(a, _no_handle)] for k, a in kwargs.items()])
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _ask("getattr", h=self._h, name=name)
    def __iter__(self):
        it = _ask("iter", h=self._h)
        while True:
            try:
                item = _ask("next", h=it._h)
            except _Exhausted:
                return
            yield item
    def __len__(self):
        return _ask("len", h=self._h)
    def __getitem__(self, key):
        return _ask("getitem", h=self._h, key=_enc(key, _no_handle))
    def __repr__(self):
        return "<the solution's %s>" % self._type

def _no_handle(x):
    if type(x) is Remote:
        return {"h": [x._h, x._type, x._callable]}
    raise TypeError("only data (numbers, strings, bytes, lists, tuples, dicts, sets) can be passed to the "
                    "solution, not %s" % type(x).__name__)

def _test_names(sources):
    "The names the tests read from their globals but never bind at the top level; those they call; `x` of `x.y`."
    read, bound, called, dotted = set(), set(), set(), set()
    def walk(table, top):
        for symbol in table.get_symbols():
            name = symbol.get_name()
            if top and (symbol.is_assigned() or symbol.is_imported() or symbol.is_namespace()):
                bound.add(name)
            elif symbol.is_referenced() and (top or symbol.is_global()):
                read.add(name)
        for child in table.get_children():
            walk(child, False)
    for source in sources:
        try:
            walk(symtable.symtable(source, "<test>", "exec"), True)
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    called.add(node.func.id)
                elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                    dotted.add(node.value.id)
        except SyntaxError:
            pass
    return read - bound, called, dotted

def _module(name):
    "The module `name` as the evaluator imports it, or None (not a module here, or one that acts on import)."
    top = name.partition(".")[0]
    if not all(part.isidentifier() for part in name.split(".")) or top in _ACTS_ON_IMPORT:
        return None
    try:
        return importlib.import_module(name) if _is_module(top) else None
    except Exception:
        return None

def _is_module(name):
    try:
        return importlib.util.find_spec(name) is not None
    except Exception:  # e.g. __main__ (no spec), a name not importable
        return False

def _namespace():
    "The tests' globals: the real builtins and modules, and from the solution only its own definitions."
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        defined = {str(k): v if type(v) is str else None for k, v in _ask("names")}
    except Exception:
        defined = {}
    free, called, dotted = _test_names([source for source, _ in _tests])
    rebound = []
    for name in sorted(free & set(defined)):
        claim = defined[name]
        if hasattr(builtins, name):  # the tests get the builtin; a solution that replaced it fails them
            if claim != "builtin":
                rebound.append("`%s`, a builtin" % name)
        elif name in dotted and name not in called and _is_module(name):  # used as a module: `math.pi`
            if claim != "module:" + name:  # e.g. a `class math` for tests that use math without importing it
                rebound.append("`%s`, a module" % name)
            elif _module(name) is not None:
                namespace[name] = _module(name)
        elif claim and claim.startswith("module:") and _module(claim[7:]) is not None:
            namespace[name] = _module(claim[7:])  # `import numpy as np`: the evaluator's own numpy
        else:
            try:
                namespace[name] = _ask("get", name=name)
            except Exception:
                pass
    return namespace, rebound

def _main():
    namespace, rebound = _namespace()
    if rebound:
        sys.stdout.write("reason: the solution rebinds %s, which the tests use: every test fails\n"
                         % ", ".join(rebound))
        namespace = None
    index = 0
    for source, counts in _tests:
        if namespace is None:
            ok = False
        else:
            ok = _run(source, namespace)
        if counts:
            sys.stdout.write("%d %s\n" % (index, "pass" if ok else "fail"))
            sys.stdout.flush()
            index += 1
    _requests.close()  # the sandbox's stdin ends: it exits

def _run(source, namespace):
    try:
        exec(compile(source, "<test>", "exec"), namespace)
        return True
    except BaseException:
        traceback.print_exc(limit=2)
        return False

_main()
""".replace("__MAX_REPLY_BYTES__", str(MAX_REPLY_BYTES))
)


def run_asserts(
    code: str, tests: Sequence[tuple[str, bool]], run_code: Callable[..., Any], **run_kwargs: Any
) -> list[bool]:
    """Pass/fail of each counted assert test of `tests` (``(source, counts)``, :func:`~.code.parse_tests`)
    against the solution `code`: the solution in the sandbox (`run_code`, :func:`~.code.run_code`, with
    `run_kwargs`), the tests in an evaluator process (see the module doc).

    Raises:
        SandboxError: the sandbox refused to run or failed to start.
    """
    from queryrl.rewards.scorers.sandbox import SandboxError, dies_with_parent
    from queryrl.rewards.scorers.sandbox_leftovers import temp_folder

    python = run_kwargs.get("python") or sys.executable
    timeout_s = float(run_kwargs.get("timeout_s", 5.0))
    memory_mb = int(run_kwargs.get("memory_mb", 512))
    counted = sum(1 for _, counts in tests if counts)
    base = temp_folder("evaluator")  # named after this trainer: removed by a later run if it is killed
    request_r, request_w = os.pipe()
    reply_r, reply_w = os.pipe()
    evaluator: subprocess.Popen[bytes] | None = None
    try:
        tests_file = os.path.join(base, "tests.json")
        with open(tests_file, "w", encoding="utf-8") as f:
            json.dump([list(t) for t in tests], f)
        limits = [str(int(timeout_s) + 2), str(max(memory_mb, 256) << 20)]
        with tempfile.TemporaryFile() as errors:
            evaluator = subprocess.Popen(
                dies_with_parent([python, "-I", "-B", "-c", EVALUATOR, tests_file, str(request_w), *limits], python),
                stdin=reply_r, stdout=subprocess.PIPE, stderr=errors, pass_fds=(request_w,), cwd=base,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, start_new_session=True,
            )  # fmt: skip
            os.close(reply_r)
            os.close(request_w)
            reply_r = request_w = -1
            result = run_code(code, **run_kwargs, _serve=(request_r, reply_w))
            os.close(request_r)
            os.close(reply_w)
            request_r = reply_w = -1
            if result.status == "sandbox_error":
                raise SandboxError(result.stderr)
            verdicts = _read_verdicts(evaluator, time.monotonic() + timeout_s + 5.0)
    finally:
        for fd in (request_r, request_w, reply_r, reply_w):
            if fd >= 0:
                os.close(fd)
        if evaluator is not None:
            _kill(evaluator)
        shutil.rmtree(base, ignore_errors=True)
    return [verdicts.get(i, False) for i in range(counted)]


def _read_verdicts(evaluator: subprocess.Popen[bytes], deadline: float) -> dict[int, bool]:
    """The evaluator's ``<index> pass|fail`` lines until it exits or the deadline (then: the rest fail)."""
    assert evaluator.stdout is not None
    fd, data = evaluator.stdout.fileno(), bytearray()
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([fd], [], [], min(left, 0.1))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    verdicts: dict[int, bool] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        if line.startswith("reason: "):
            logger.debug("code reward: %s", line[8:])
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit() and parts[1] in ("pass", "fail"):
            verdicts[int(parts[0])] = parts[1] == "pass"
    return verdicts


def _kill(proc: subprocess.Popen[bytes]) -> None:
    from queryrl.rewards.scorers.sandbox import kill_group

    kill_group(proc)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
