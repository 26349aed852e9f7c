"""What a :class:`~queryrl.rewards.judge.JudgeClient` remembers of earlier requests: one judgment
(:class:`JudgeResult`), the verdicts on disk (:class:`VerdictCache`) and the requests a server refused
(:class:`RefusalMemory`), each keyed by the request's hash (``JudgeClient.cache_key``).

The verdict cache. With the client's ``cache_dir``, a successful verdict is stored as
``<cache_dir>/<k[:2]>/<k>.json`` where ``k`` is the sha256 of the full request (base_url, model, messages,
every request setting, schema), written to a temporary name and renamed. Failures are never cached; an
unreadable file is ignored and overwritten by the next success. A cached result carries the token counts
of the call that made it; the client's counters count only tokens spent now.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from queryrl.atomic import atomic_write_text

log = logging.getLogger("queryrl.rewards.judge")

# a request refused with a 4xx that is not retried is not re-sent for this long (an identical retry of the
# sample by a reward manager gets the same failure, unpaid); the newest REFUSAL_MEMORY of them are kept
REFUSAL_TTL_S = 600.0
REFUSAL_MEMORY = 10_000


@dataclass(frozen=True)
class JudgeResult:
    """One judgment. ``verdict`` is None exactly when it failed, and then ``error`` says why."""

    verdict: dict[str, Any] | None
    raw: str | None  # the model's reply text (None when no reply arrived)
    error: str | None
    cached: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    refused: bool = False  # the server answered a 4xx that is not retried: the request itself is wrong
    reasoning_tokens: int = 0  # the part of completion_tokens the model spent reasoning (billed as output)

    @property
    def ok(self) -> bool:
        return self.verdict is not None


class VerdictCache:
    """Successful verdicts of `model` as ``<folder>/<k[:2]>/<k>.json`` (``k`` the request hash), written
    atomically; a torn or hand-edited file is ignored (the next success overwrites it), a full disk costs
    the cache, not the verdict. Errors, refusals and latencies are not stored."""

    def __init__(self, folder: Path, model: str) -> None:
        self.folder = folder
        self.model = model

    def path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def read(self, key: str) -> JudgeResult | None:
        path = self.path(key)
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data.get("verdict"), dict):
                raise ValueError("no verdict")
            return JudgeResult(
                data["verdict"],
                data.get("raw"),
                None,
                cached=True,
                prompt_tokens=int(data.get("prompt_tokens", 0)),
                completion_tokens=int(data.get("completion_tokens", 0)),
                reasoning_tokens=int(data.get("reasoning_tokens", 0)),
            )
        except Exception as e:  # a torn or hand-edited file: ignore it, the next success overwrites it
            log.warning("judge cache: ignoring unreadable %s (%s)", path, type(e).__name__)
            return None

    def write(self, key: str, result: JudgeResult) -> None:
        path = self.path(key)
        record = {k: v for k, v in asdict(result).items() if k not in ("error", "cached", "latency_s", "refused")}
        record["model"] = self.model
        try:
            atomic_write_text(path, json.dumps(record, ensure_ascii=False))
        except OSError as e:  # a full disk costs the cache, not the verdict
            log.warning("judge cache: cannot write %s: %s", path, e)


class RefusalMemory:
    """The requests a server refused (a 4xx that is not retried), for `ttl_s` seconds, the newest `size` of
    them: the same request again gets the same failure without a paid call. Thread-safe."""

    def __init__(self, ttl_s: float = REFUSAL_TTL_S, size: int = REFUSAL_MEMORY) -> None:
        self.ttl_s = ttl_s
        self.size = size
        self._lock = threading.Lock()
        self._refused: OrderedDict[str, tuple[float, JudgeResult]] = OrderedDict()  # key -> (when, result)

    def remember(self, key: str, result: JudgeResult) -> None:
        with self._lock:
            self._refused[key] = (time.monotonic(), result)
            while len(self._refused) > self.size:
                self._refused.popitem(last=False)

    def recall(self, key: str) -> JudgeResult | None:
        """The remembered refusal of this very request, if the server refused it within the last `ttl_s`
        seconds (its error says it was not re-sent)."""
        with self._lock:
            entry = self._refused.get(key)
            if entry is None:
                return None
            age = time.monotonic() - entry[0]
            if age > self.ttl_s:
                del self._refused[key]
                return None
        error = f"{entry[1].error} (not re-sent: the server refused this same request {age:.0f} s ago)"
        return replace(entry[1], error=error, latency_s=0.0)
