"""The reward's shared state is one object (:data:`~queryrl.apps.query_rewrite.reward.shared.SHARED`) that owns
its locks, clients, caches and counters: no module of the reward keeps a lock or a mutable dict of its own,
threads share one client per key and lose no count, and a reset starts clean."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

from queryrl.apps.query_rewrite.config import QueryRewriteJudgeConfig, QueryRewriteRAGConfig
from queryrl.apps.query_rewrite.reward.intent import pop_intent_metrics, rewrite_intent
from queryrl.apps.query_rewrite.reward.judge import judge_client
from queryrl.apps.query_rewrite.reward.rag import rag_client, rag_clients
from queryrl.apps.query_rewrite.reward.score import pop_reward_metrics
from queryrl.apps.query_rewrite.reward.shared import SHARED, SharedClients

REWARD = Path(__file__).resolve().parents[4] / "queryrl" / "apps" / "query_rewrite" / "reward"
STATE_CALLS = {"Lock", "RLock", "WeakKeyDictionary", "WeakValueDictionary", "dict", "list", "set", "OrderedDict"}


def _module_state(path: Path) -> list[str]:
    """Module-level names bound to a lock or an empty (so: filled later) container."""
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        value = node.value
        elements = value.keys if isinstance(value, ast.Dict) else getattr(value, "elts", None)
        empty = isinstance(value, ast.Dict | ast.List | ast.Set) and not elements
        made = isinstance(value, ast.Call) and (
            getattr(value.func, "attr", None) in STATE_CALLS or getattr(value.func, "id", None) in STATE_CALLS
        )
        if empty or made:
            found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)[:60]}")
    return found


def test_no_reward_module_keeps_loose_state_or_imports_a_lock() -> None:
    loose = [line for path in sorted(REWARD.glob("*.py")) for line in _module_state(path) if path.name != "shared.py"]
    assert loose == []
    for path in REWARD.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert not any("LOCK" in alias.name for alias in node.names), f"{path.name} imports a lock"


def test_threads_share_one_client_per_key_and_lose_no_count() -> None:
    shared = SharedClients()
    made: list[object] = []

    def make() -> object:
        time.sleep(0.01)  # a slow client: the other threads arrive while it is made
        made.append(object())
        return made[-1]

    got: list[object] = []

    def work() -> None:
        got.append(shared.client("rag", ("url", 5), make))
        for _ in range(500):
            shared.count("rag/candidate_calls")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1
    assert all(client is made[0] for client in got)
    assert shared.pop_counts() == {"rag/candidate_calls": 4000.0}
    assert shared.pop_counts() == {}
    assert shared.clients("rag") == made
    assert shared.clients("judge") == []


def test_the_reward_clients_live_in_shared_and_a_reset_forgets_them() -> None:
    SHARED.reset()
    rag = rag_client(QueryRewriteRAGConfig(max_retries=0))
    judge = judge_client(QueryRewriteJudgeConfig(backend="openai", base_url="http://127.0.0.1:9", model="m"))
    assert rag_client(QueryRewriteRAGConfig(max_retries=0)) is rag
    assert rag_clients() == [rag]
    assert SHARED.clients("judge") == [judge]
    SHARED.reset()
    assert rag_clients() == []
    assert rag_client(QueryRewriteRAGConfig(max_retries=0)) is not rag
    SHARED.reset()


def test_intent_counts_are_popped_apart_from_the_other_counters() -> None:
    SHARED.reset()
    info = {"contexts": [{"role": "user", "content": "这款手机多少钱？"}]}
    rewrite_intent("这款手机多少钱", info, no_retrieval=False)
    rewrite_intent(None, info, no_retrieval=False)  # no parse: changed
    SHARED.count("rag/candidate_calls", 2)
    assert pop_intent_metrics() == {"reward/intent/changed": 0.5, "reward/intent/checked": 2.0}
    assert pop_reward_metrics() == {"rag/candidate_calls": 2.0}
    assert pop_reward_metrics() == {}
