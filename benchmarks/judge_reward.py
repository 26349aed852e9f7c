"""The reward function of the judge benchmark: one chat-completion call per sample to a judge server.

``compute_score`` posts the response and the target to ``{url}/chat/completions`` (an
OpenAI-compatible server, here :mod:`queryrl.testing.judge_server` on loopback with a fixed
latency) and returns the ``score`` of the JSON reply. :func:`judge` is the server side: the toy
preset's string similarity, so the rewards equal the toy preset's.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

_CLIENTS: dict[int, httpx.AsyncClient] = {}  # one client per event loop (a client is bound to its loop)


def judge(messages: list[dict[str, Any]]) -> str:
    """Server side: the similarity of ``response`` to ``target`` (a JSON user message), as JSON."""
    from queryrl.rewards.scorers.toy import compute_score as similarity

    body = json.loads(str(messages[-1]["content"]))
    return json.dumps({"score": similarity("toy/target_string", body["response"], body["target"])})


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict[str, Any] | None = None,
    url: str = "",
) -> float:
    """One judge call for one response; the judge's ``score``."""
    loop = asyncio.get_running_loop()
    client = _CLIENTS.get(id(loop))
    if client is None:
        client = _CLIENTS[id(loop)] = httpx.AsyncClient(
            timeout=30.0, limits=httpx.Limits(max_connections=256, max_keepalive_connections=256)
        )
    content = json.dumps({"response": solution_str, "target": str(ground_truth)})
    reply = await client.post(
        f"{url}/chat/completions",
        json={"model": "judge", "messages": [{"role": "user", "content": content}], "temperature": 0},
    )
    reply.raise_for_status()
    return float(json.loads(reply.json()["choices"][0]["message"]["content"])["score"])
