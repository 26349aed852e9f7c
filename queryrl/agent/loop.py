"""The multi-turn agent rollout: the policy generates a turn, the agent loop answers (tools), repeat.

Notation: `N` sequences, `T` response tokens.

:class:`AgentRollout` wraps any rollout backend (it only needs ``generate``) and has the same
interface, so the trainer does not change. Each sequence is one episode; all active episodes
generate their next turn in one batched call. A response is the concatenation of turns::

    [forced prefix]  model turn 1 ... <eos>  \\n<|im_start|>tool\\n{result}<|im_end|>\\n<|im_start|>assistant\\n
     mask 0          mask 1 (incl. its EOS)  mask 0 (inserted by the loop: template and tool output)

    model turn 2 ... <eos>
    mask 1

``response_mask`` is 1 exactly on the tokens the policy sampled (``rollout_logprobs`` is 0
elsewhere); ``response_attention_mask`` is 1 on every real token, so training attends to the
tool outputs as the sampler did. The whole response stays within ``max_new_tokens``.

Which agent loop runs is chosen per row by a data column (``agent_key``, default
``agent_name``): ``single_turn`` (plain generation) or ``tool_agent`` (hermes/OpenAI tool
calls, see :mod:`queryrl.agent.parsing`), or any loop registered in :data:`AGENT_LOOPS`.

Forced prefix: when a row has ``prefix_key`` (default ``assistant_prefix``), its text opens
the first assistant turn as tokens with mask 0 (written by the data, not sampled), and the
policy continues it; a prefix that ends with the EOS token is a whole forced turn, answered
by the agent loop before the policy generates anything (``forced_tool_calls`` counts its calls).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import nn

from queryrl.agent.parsing import parse_tool_calls
from queryrl.agent.tools import ToolSet
from queryrl.registry import Registry
from queryrl.rollout.base import RolloutOutput, SamplingParams, left_pad

Message = dict[str, str]


@dataclass
class AgentSettings:
    """Limits and data columns of the agent rollout (``rollout.multi_turn``).

    Attributes:
        max_turns: assistant turns the policy generates in one episode.
        max_tool_calls: tool calls executed in one episode; later calls get an error message.
        agent_key: the data column naming each row's agent loop.
        default_agent: the loop of rows without that column.
        prefix_key: the data column with a forced assistant prefix ("" = none).
    """

    max_turns: int = 5
    max_tool_calls: int = 5
    agent_key: str = "agent_name"
    default_agent: str = "tool_agent"
    prefix_key: str = "assistant_prefix"


@dataclass
class Episode:
    """One sequence's state and counters (the counters become ``extra_info`` and metrics)."""

    row: Mapping[str, Any]
    agent: str
    num_turns: int = 0
    num_tool_calls: int = 0
    tool_errors: int = 0
    forced_tool_calls: int = 0
    stop_reason: str = ""
    messages: list[Message] = field(default_factory=list)  # the assistant turns and answers, as text

    def extras(self) -> dict[str, Any]:
        return {
            "agent_name": self.agent,
            "num_turns": self.num_turns,
            "num_tool_calls": self.num_tool_calls,
            "tool_errors": self.tool_errors,
            "forced_tool_calls": self.forced_tool_calls,
            "stop_reason": self.stop_reason,
        }


class AgentLoop(Protocol):
    """Answers each finished assistant turn of an episode."""

    def respond(self, episode: Episode, turn_text: str, forced: bool) -> list[Message] | None:
        """The messages that answer `turn_text` (e.g. ``{"role": "tool", "content": ...}``), or None
        when the episode is over (then set ``episode.stop_reason``). ``forced``: the turn was
        written by the data, not sampled."""
        ...


AgentLoopFactory = Callable[[AgentSettings, ToolSet], AgentLoop]
AGENT_LOOPS: Registry[AgentLoopFactory] = Registry("agent loop")


class SingleTurnAgent:
    """Plain generation: the first turn is the response."""

    def respond(self, episode: Episode, turn_text: str, forced: bool) -> list[Message] | None:
        episode.stop_reason = "done"
        return None


class ToolAgent:
    """Executes the tool calls of each turn; a turn without calls is the final answer.

    Malformed calls, unknown tools, invalid arguments, failing or slow tools and calls past
    ``max_tool_calls`` are each answered with an ``Error: ...`` message (counted in
    ``tool_errors``); a turn with calls after ``max_turns`` ends the episode (``max_turns``).
    """

    def __init__(self, settings: AgentSettings, tools: ToolSet) -> None:
        self.settings = settings
        self.tools = tools

    def respond(self, episode: Episode, turn_text: str, forced: bool) -> list[Message] | None:
        calls = parse_tool_calls(turn_text)
        if not calls:
            episode.stop_reason = "done"
            return None
        if episode.num_turns >= self.settings.max_turns:
            episode.stop_reason = "max_turns"
            return None
        allowed = max(self.settings.max_tool_calls - episode.num_tool_calls, 0)
        futures = [self.tools.submit(c) for c in calls[:allowed]]
        results = self.tools.results(futures)
        texts = [r.text for r in results]
        errors = sum(r.error for r in results)
        over = len(calls) - len(futures)
        texts += [f"Error: the tool-call limit ({self.settings.max_tool_calls} per episode) is reached"] * over
        episode.num_tool_calls += len(calls)
        episode.tool_errors += errors + over
        if forced:
            episode.forced_tool_calls += len(calls)
        return [{"role": "tool", "content": t} for t in texts]


@AGENT_LOOPS.register("single_turn")
def _single_turn(settings: AgentSettings, tools: ToolSet) -> AgentLoop:
    return SingleTurnAgent()


@AGENT_LOOPS.register("tool_agent")
def _tool_agent(settings: AgentSettings, tools: ToolSet) -> AgentLoop:
    return ToolAgent(settings, tools)


class ChatContinuation:
    """The text the chat template puts after an assistant turn's EOS token and before the next
    assistant turn, for some inserted messages (tool results): ``\\n<|im_start|>tool\\n...``.

    Rendered as the difference of two conversations through the tokenizer's own template, so it
    follows the model's format (ChatML, Qwen2.5's ``<tool_response>`` wrapping, ...).
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._base: list[Message] = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]

    def text(self, messages: list[Message]) -> str:
        tok = self.tokenizer
        if not getattr(tok, "chat_template", None):
            return "\n" + "\n".join(m["content"] for m in messages) + "\n"
        before = str(tok.apply_chat_template(self._base, tokenize=False, add_generation_prompt=False))
        after = str(tok.apply_chat_template(self._base + messages, tokenize=False, add_generation_prompt=True))
        if not after.startswith(before):
            raise ValueError("the chat template renders an earlier turn differently once tool messages follow")
        eos = str(tok.eos_token or "")
        tail = before[before.rindex(eos) + len(eos) :] if eos and eos in before else ""
        return tail + after[len(before) :]

    def ids(self, messages: list[Message]) -> list[int]:
        return list(self.tokenizer(self.text(messages), add_special_tokens=False)["input_ids"])


@dataclass
class _Seq:
    """A sequence being built: its episode, loop, and the response so far."""

    prompt: list[int]
    prompt_index: int
    episode: Episode
    loop: AgentLoop
    ids: list[int] = field(default_factory=list)
    mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turn_start: int = 0  # where the current assistant turn starts in the response
    done: bool = False
    truncated: bool = False

    def add(self, ids: Sequence[int], trained: bool, logprobs: Sequence[float] | None = None) -> None:
        self.ids += list(ids)
        self.mask += [1.0 if trained else 0.0] * len(ids)
        self.logprobs += list(logprobs) if logprobs is not None else [0.0] * len(ids)


class AgentRollout:
    """A rollout backend that runs multi-turn episodes on top of another backend.

    Args:
        inner: a rollout backend (``generate(prompts, params)``, ``update_weights``).
        tokenizer: the policy's tokenizer (chat template, eos and pad ids).
        settings: the limits and data columns.
        tools: the tools the ``tool_agent`` loop calls.
        micro_batch_size: episodes run (and yielded as one chunk) together.
    """

    wants_rows = True  # generate_chunks takes the data rows (the agent choice, the forced prefix)

    def __init__(
        self, inner: Any, tokenizer: Any, settings: AgentSettings, tools: ToolSet, micro_batch_size: int = 64
    ) -> None:
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1 (got {micro_batch_size})")
        self.inner = inner
        self.tokenizer = tokenizer
        self.settings = settings
        self.tools = tools
        self.micro_batch_size = micro_batch_size
        self.pad_token_id = int(tokenizer.pad_token_id)
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.continuation = ChatContinuation(tokenizer)
        AGENT_LOOPS.get(settings.default_agent)  # an unknown default is an error now, not mid-run

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, rows: Sequence[Mapping[str, Any]] | None = None
    ) -> RolloutOutput:
        """All episodes in one output (see :meth:`generate_chunks`)."""
        return RolloutOutput.concat(list(self.generate_chunks(prompts, params, rows)), self.pad_token_id)

    def generate_chunks(
        self, prompts: list[list[int]], params: SamplingParams, rows: Sequence[Mapping[str, Any]] | None = None
    ) -> Iterator[RolloutOutput]:
        """``params.n`` episodes per prompt (prompt-major), ``micro_batch_size`` at a time.

        Args:
            prompts: token ids per prompt.
            params: sampling; ``max_new_tokens`` bounds the whole multi-turn response.
            rows: the data row of each prompt (agent choice, forced prefix); None = defaults.
        """
        if rows is not None and len(rows) != len(prompts):
            raise ValueError(f"{len(rows)} rows for {len(prompts)} prompts")
        index = [i for i in range(len(prompts)) for _ in range(params.n)]
        for start in range(0, len(index), self.micro_batch_size):
            seqs = [
                self._start(prompts[i], i, rows[i] if rows is not None else {})
                for i in index[start : start + self.micro_batch_size]
            ]
            self._run(seqs, params)
            yield self._output(seqs)

    def update_weights(self, source: nn.Module) -> None:
        """Sync the inner backend's weights."""
        self.inner.update_weights(source)

    # --- episodes ---------------------------------------------------------------------------------

    def _start(self, prompt: list[int], prompt_index: int, row: Mapping[str, Any]) -> _Seq:
        name = str(row.get(self.settings.agent_key) or self.settings.default_agent)
        loop = AGENT_LOOPS.get(name)(self.settings, self.tools)
        return _Seq(list(prompt), prompt_index, Episode(row, name), loop)

    def _run(self, seqs: list[_Seq], params: SamplingParams) -> None:
        budget = params.max_new_tokens
        forced: list[_Seq] = []
        for s in seqs:
            prefix = s.episode.row.get(self.settings.prefix_key) if self.settings.prefix_key else None
            if prefix:
                ids = list(self.tokenizer(str(prefix), add_special_tokens=False)["input_ids"])
                self._insert(s, ids, budget)
                if not s.done and ids[-1] == self.eos_token_id:
                    forced.append(s)
        self._respond(forced, budget, forced=True)
        while True:
            active = [s for s in seqs if not s.done]
            if not active:
                return
            self._generate_turn(active, params)
            self._respond([s for s in active if not s.done], budget, forced=False)

    def _generate_turn(self, active: list[_Seq], params: SamplingParams) -> None:
        """One assistant turn for every active sequence, in one batched call."""
        budget = params.max_new_tokens
        room = [budget - len(s.ids) for s in active]
        turn_params = dataclasses.replace(params, n=1, max_new_tokens=max(room))
        out = self.inner.generate([s.prompt + s.ids for s in active], turn_params)
        for row, (s, left) in enumerate(zip(active, room, strict=True)):
            keep = out.response_mask[row].bool()
            ids = out.response_ids[row][keep].tolist()[:left]
            lps = out.rollout_logprobs[row][keep].tolist()[:left]
            s.add(ids, trained=True, logprobs=lps)
            s.episode.num_turns += 1
            if not ids or ids[-1] != self.eos_token_id:  # the budget ran out inside the turn
                s.done, s.truncated = True, True
                s.episode.stop_reason = "length"

    def _respond(self, seqs: list[_Seq], budget: int, forced: bool) -> None:
        """Let each sequence's agent loop answer its finished turn (concurrently: tools may wait)."""
        if not seqs:
            return
        texts = [self.tokenizer.decode(s.ids[s.turn_start :], skip_special_tokens=True) for s in seqs]
        with cf.ThreadPoolExecutor(max_workers=min(len(seqs), 16)) as pool:
            answers = list(pool.map(lambda s, t: s.loop.respond(s.episode, t, forced), seqs, texts))
        for s, text, answer in zip(seqs, texts, answers, strict=True):
            s.episode.messages.append({"role": "assistant", "content": text})
            if answer is None:
                s.done = True
                continue
            if s.episode.num_turns >= self.settings.max_turns:  # a custom loop that ignores the limit
                s.done = True
                s.episode.stop_reason = "max_turns"
                continue
            s.episode.messages += answer
            self._insert(s, self.continuation.ids(answer), budget)
            s.turn_start = len(s.ids)

    def _insert(self, s: _Seq, ids: list[int], budget: int) -> None:
        """Append tokens the policy did not sample (mask 0); past the budget the episode ends."""
        room = budget - len(s.ids)
        s.add(ids[:room], trained=False)
        if len(ids) >= room:  # no room left for a model turn
            s.done, s.truncated = True, True
            s.episode.stop_reason = "length"

    def _output(self, seqs: list[_Seq]) -> RolloutOutput:
        prompt_ids, prompt_mask = left_pad([s.prompt for s in seqs], self.pad_token_id)
        width = max((len(s.ids) for s in seqs), default=0)
        n = len(seqs)
        response_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        response_mask = torch.zeros((n, width))
        attention = torch.zeros((n, width), dtype=torch.long)
        logprobs = torch.zeros((n, width))
        for i, s in enumerate(seqs):
            t = len(s.ids)
            response_ids[i, :t] = torch.tensor(s.ids, dtype=torch.long)
            response_mask[i, :t] = torch.tensor(s.mask)
            attention[i, :t] = 1
            logprobs[i, :t] = torch.tensor(s.logprobs)
        return RolloutOutput(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=response_ids,
            response_mask=response_mask,
            rollout_logprobs=logprobs * response_mask,
            prompt_index=torch.tensor([s.prompt_index for s in seqs], dtype=torch.long),
            truncated=torch.tensor([s.truncated for s in seqs], dtype=torch.bool),
            response_attention_mask=attention,
            extras=[s.episode.extras() for s in seqs],
        )


EXTRA_METRICS = {
    "num_turns": "num_turns",
    "num_tool_calls": "tool_calls",
    "tool_errors": "tool_errors",
    "forced_tool_calls": "tool_calls_forced",
}


def episode_metrics(extras: Sequence[Mapping[str, Any]] | None) -> dict[str, float]:
    """``num_turns/mean|max``, ``tool_calls/mean``, ``tool_errors/mean``, ``tool_calls_forced/mean``
    and ``agent/stop/<reason>`` (fractions) over the rows that have agent extras."""
    rows = [e for e in extras or [] if "num_turns" in e]
    if not rows:
        return {}
    metrics: dict[str, float] = {}
    for key, name in EXTRA_METRICS.items():
        values = [float(e.get(key, 0)) for e in rows]
        metrics[f"{name}/mean"] = sum(values) / len(values)
        metrics[f"{name}/max"] = max(values)
    for reason in sorted({str(e.get("stop_reason", "")) for e in rows}):
        metrics[f"agent/stop/{reason or 'unknown'}"] = sum(e.get("stop_reason") == reason for e in rows) / len(rows)
    return metrics
