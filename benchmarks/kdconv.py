"""KdConv travel benchmark: SFT + GRPO query rewriter vs the baselines (``make bench-kdconv``).

    python benchmarks/kdconv.py                      # -> benchmarks/results/kdconv.json
    KDCONV_TEST=path/to/test.json python benchmarks/kdconv.py
    python benchmarks/kdconv.py --sft-steps 200 --grpo-steps 20   # a quick run
    python benchmarks/kdconv.py --augment 8 --sft-prompt-loss 1.0  # SFT on 8 entity-swapped copies too

Pipeline (the ``make demo`` pipeline on KdConv, config ``configs/query_rewrite_kdconv.yaml``):

1. Data. The conversations of ``$KDCONV_DIR/dev.json`` (default ``../shared/data/kdconv/travel``)
   are split by conversation id (seeded): 80 % train, 10 % validation, 10 % held-out test. Both
   speakers ask (:func:`~queryrl.apps.query_rewrite.kdconv.load_kdconv_conversations` with
   ``both_speakers``); only turns whose reply uses the knowledge base are kept. The policy's prompt
   shows the most recent history only (at most ``--history-chars`` characters of earlier messages, at
   least the previous one) so that it fits ``data.max_prompt_length``; ``extra_info.contexts`` keeps
   the whole conversation, which the baselines and the reference rewriter see. The SFT target
   (``--sft-target``) is by default ``reference``: the entity-aware reference rewriter's answer on the
   prompt's history (KB entity names as a jieba dictionary, :class:`~queryrl.rag.HeuristicRewriter`
   with ``latin_entities=False``); ``gold`` builds it from the training row's gold documents
   (:func:`gold_query`: the gold entity when the prompt shows it, the turn, the gold attributes).
   Test rows never carry gold-derived text.

   ``--augment K`` (default 0: off) adds K entity-swapped copies of each *training* dialogue
   (:func:`augment_dialogues`): every knowledge-base entity the dialogue mentions (in its messages, found
   longest first so that 北京故宫 is not read as 故宫, or in its ``attrs``) is replaced everywhere in it
   (messages, ``attrs`` names and values, so the gold ``entity::attribute`` becomes
   ``new_entity::attribute``) by another KB entity, drawn with a seeded ``random.Random`` and, where one
   exists, having the attributes the dialogue uses. The copies go through the same rows, window and SFT
   target (the reference's answer on the swapped history) into ``train_aug.parquet``, which only
   ``queryrl sft`` reads (``sft.train_files``): the tiny model sees many more entity names to copy from
   the history. GRPO keeps ``train.parquet``, so its reward never gets a gold id the corpus lacks; the
   tokenizer (``model.tiny.corpus_datasets``) is trained on ``train.parquet`` only unless
   ``--tokenizer-extra``. Validation and test rows are never augmented. ``--sft-prompt-loss W`` passes
   ``sft.prompt_loss_weight=W`` to SFT.

   ``--extra-sft film,music`` (default off) adds the conversations of KdConv's other domains, ``dev.json``
   and ``test.json`` of ``film/`` and ``music/`` beside the travel folder (:func:`extra_sft_rows`): their
   turns with gold documents, with their own domain line, the same window and SFT target, the reference
   rewriter knowing that file's entity names (the ``attrs`` names, :func:`attr_entity_names`; those
   domains have no knowledge base here), into ``extra.parquet``, which like ``train_aug.parquet`` only
   ``queryrl sft`` reads (their gold ids are not in the travel corpus): more diverse conversation text
   with the same kind of target. ``--tokenizer-extra`` also trains the tokenizer on the SFT-only files
   (``train_aug`` and ``extra``: ``model.tiny.corpus_datasets`` of every stage that builds a model; the
   evaluation loads the SFT and GRPO folders, which carry that tokenizer).
2. ``queryrl sft``, ``queryrl train`` (GRPO from the SFT model against the embedded RAG over the
   knowledge base, corpus ``kdconv:KB``), ``queryrl export`` of the last checkpoint.
3. ``queryrl eval`` on the held-out conversations, or on the KdConv file named by ``KDCONV_TEST``
   (all its conversations), with raw_turn, concat_last3, reference, sft and grpo.

Output: ``benchmarks/results/kdconv.json`` (written atomically), the eval JSON (``systems``,
``eval_file``, ...) plus ``bench`` (settings, augmentation, extra SFT rows, tokenizer data, data sizes,
wall time per stage) and ``goal``: GRPO's Recall@5 on the context-dependent turns against twice
concat_last3's. The numbers are what the evaluation measured, met or not. Without the KdConv folder
the bench prints why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "query_rewrite_kdconv.yaml"
DEFAULT_KDCONV_DIR = REPO.parent / "shared" / "data" / "kdconv" / "travel"
RESULTS = REPO / "benchmarks" / "results" / "kdconv.json"
WORK = REPO / "runs" / "bench_kdconv"
GOAL_FACTOR = 2.0
SYSTEMS = ("raw_turn", "concat_last3", "reference", "sft", "grpo")


# --- data -----------------------------------------------------------------------------------------


def split_ids(ids: Sequence[str], val_fraction: float, test_fraction: float, seed: int) -> dict[str, set[str]]:
    """Conversation ids -> train/val/test sets: sorted, shuffled with `seed`, cut (rounded shares)."""
    if val_fraction < 0 or test_fraction < 0 or val_fraction + test_fraction >= 1:
        raise ValueError(f"need 0 <= val_fraction, test_fraction and a sum < 1, got {val_fraction}, {test_fraction}")
    ordered = sorted(set(ids))
    random.Random(seed).shuffle(ordered)
    n_val, n_test = round(len(ordered) * val_fraction), round(len(ordered) * test_fraction)
    return {
        "val": set(ordered[:n_val]),
        "test": set(ordered[n_val : n_val + n_test]),
        "train": set(ordered[n_val + n_test :]),
    }


def history_window(contexts: Sequence[dict[str, Any]], max_chars: int) -> list[dict[str, Any]]:
    """The last message of `contexts` and the earlier ones, newest first, while their text stays within
    `max_chars` characters (the previous message is always kept, whatever its length)."""
    window = [dict(contexts[-1])]
    used = 0
    for i, message in enumerate(reversed(contexts[:-1])):
        used += len(str(message.get("content", "")))
        if i > 0 and used > max_chars:
            break
        window.insert(0, dict(message))
    return window


def gold_query(window: Sequence[dict[str, Any]], gold_doc_ids: Sequence[str], reference: str) -> str:
    """A training row's query built with its gold documents (``entity::attribute`` ids): the entity of
    the first gold document when the window shows it (else `reference`'s query), the current turn,
    then that entity's gold attributes that the query does not contain yet."""
    entity = gold_doc_ids[0].split("::", 1)[0]
    current = str(window[-1]["content"]).strip()
    if entity in current:
        query = current
    elif any(entity in str(m["content"]) for m in window):
        query = f"{entity} {current}"
    else:
        query = reference
    for doc in gold_doc_ids:
        name, _, attribute = doc.partition("::")
        if name == entity and attribute and attribute not in query:
            query = f"{query} {attribute}"
    return query


def windowed_rows(
    rows: list[dict[str, Any]], rewriter: Any, max_chars: int, sft_target: str = "reference", lang: str = "zh"
) -> list[dict[str, Any]]:
    """`rows` with the prompt built from :func:`history_window` of the contexts and the SFT target on
    that same window (what the policy can see); rows are changed in place.

    `sft_target`: ``reference`` (`rewriter`'s answer) or ``gold`` (:func:`gold_query`, from the row's
    gold documents; fine for training rows, whose labels the GRPO reward uses anyway).
    """
    from queryrl.apps.query_rewrite.prompts import build_messages
    from queryrl.apps.query_rewrite.reward_modes import parse_answer
    from queryrl.apps.query_rewrite.sft_targets import SFT_TARGET_KEY, reference_target, render_answer

    if sft_target not in ("reference", "gold"):
        raise ValueError(f"unknown sft_target {sft_target!r}; use reference or gold")
    for row in rows:
        info = row["extra_info"]
        window = history_window(info["contexts"], max_chars)
        row["prompt"] = build_messages(
            window,
            info.get("user_profile", ""),
            info.get("history_summary", ""),
            lang,
            domain=info.get("domain"),
            answer_fields=info.get("answer_fields") or ("rewritten_query",),
            answer_format=info.get("answer_format") or "json",
        )
        info["prompt_messages"] = len(window)
        target = reference_target({**info, "contexts": window}, rewriter)
        if sft_target == "gold":
            parsed = parse_answer(target, answer_format=info.get("answer_format") or "json")
            assert parsed is not None  # the reference's own answer
            gold = list(row["reward_model"]["ground_truth"]["gold_doc_ids"])
            carried = {
                "rewritten_query": gold_query(window, gold, parsed.rewritten_query),
                "user_profile": info.get("user_profile", ""),
                "history_summary": info.get("history_summary", ""),
            }
            target = render_answer(carried, info)
        info[SFT_TARGET_KEY] = target
    return rows


# --- entity-swap augmentation (train split, SFT only) -----------------------------------------------


def entity_pattern(names: Iterable[str]) -> re.Pattern[str]:
    """A regex matching any of `names`, longest first: at each position the longest name wins, so that
    ``北京故宫`` is one match and not ``故宫`` inside it."""
    ordered = sorted({n for n in names if n}, key=lambda n: (-len(n), n))
    if not ordered:
        raise ValueError("entity_pattern: no entity names")
    return re.compile("|".join(re.escape(n) for n in ordered))


def kb_attributes(docs: Iterable[Mapping[str, str]]) -> dict[str, frozenset[str]]:
    """Entity name -> its attributes, from :func:`~queryrl.apps.query_rewrite.kdconv.kdconv_corpus`'s
    documents (``entity::attribute`` ids), in the knowledge base's order."""
    attrs: dict[str, set[str]] = {}
    for doc in docs:
        entity, _, attribute = str(doc["doc_id"]).partition("::")
        attrs.setdefault(entity, set()).add(attribute)
    return {entity: frozenset(values) for entity, values in attrs.items()}


def dialogue_entities(dialogue: Mapping[str, Any], pattern: re.Pattern[str]) -> dict[str, set[str]]:
    """The entities a KdConv dialogue mentions -> the attributes its ``attrs`` use of each, in order of
    first mention: the names `pattern` finds in the messages (longest first) and the ``attrs`` names."""
    found: dict[str, set[str]] = {}
    for message in dialogue.get("messages") or []:
        for match in pattern.finditer(str(message.get("message", ""))):
            found.setdefault(match.group(), set())
        for attr in message.get("attrs") or []:
            found.setdefault(str(attr["name"]), set()).add(str(attr["attrname"]))
    return found


def swap_mapping(
    entities: Mapping[str, Collection[str]], kb: Mapping[str, frozenset[str]], rng: random.Random
) -> dict[str, str]:
    """Each of `entities` (name -> the attributes used of it) -> a different knowledge-base entity drawn
    with `rng`: never one of `entities` nor another's replacement, never a name that contains one of those
    or is contained in one (so the swapped text cannot show an original name again), and when possible
    one that has every attribute used (its gold documents then exist in the corpus)."""
    pool = list(kb)
    taken: list[str] = list(entities)
    mapping: dict[str, str] = {}

    def free(name: str) -> bool:
        return all(name not in t and t not in name for t in taken)

    for entity, used in entities.items():
        need = frozenset(used)
        choice = None
        for _ in range(64):  # rejection sampling: almost every entity is free and most have the attributes
            name = rng.choice(pool)
            if free(name) and need <= kb[name]:
                choice = name
                break
        if choice is None:
            fits = [n for n in pool if free(n) and need <= kb[n]] or [n for n in pool if free(n)]
            if not fits:
                raise ValueError(f"no knowledge-base entity is left to replace {entity!r}")
            choice = rng.choice(fits)
        mapping[entity] = choice
        taken.append(choice)
    return mapping


def swap_entities(dialogue: Mapping[str, Any], mapping: Mapping[str, str], pattern: re.Pattern[str]) -> dict[str, Any]:
    """A copy of a KdConv dialogue with every entity of `mapping` replaced: in each message, in the
    ``attrs`` names (the gold labels) and values, and in the topic ``name``. Text is matched with
    `pattern` (longest first), so a longer entity that contains a mapped one stays whole."""

    def sub(text: str) -> str:
        return pattern.sub(lambda m: mapping.get(m.group(), m.group()), text)

    out = {k: v for k, v in dialogue.items() if k != "messages"}
    if "name" in out:
        name = str(out["name"])
        out["name"] = mapping.get(name, sub(name))
    messages = []
    for message in dialogue.get("messages") or []:
        new = {**message, "message": sub(str(message["message"]))}
        if message.get("attrs"):
            new["attrs"] = [
                {
                    **attr,
                    "name": mapping.get(str(attr["name"]), str(attr["name"])),
                    "attrvalue": sub(str(attr.get("attrvalue", ""))),
                }
                for attr in message["attrs"]
            ]
        messages.append(new)
    out["messages"] = messages
    return out


def augment_dialogues(
    dialogues: Sequence[tuple[str, Mapping[str, Any]]], kb: Mapping[str, frozenset[str]], copies: int, seed: int
) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """`copies` entity-swapped copies of each ``(id, dialogue)``: ``(id-augK, dialogue, mapping)``.

    Each dialogue draws from its own ``random.Random`` seeded with `seed` and its id, so its copies do
    not depend on the other dialogues of the split, and the first k of ``copies=n`` are ``copies=k``.
    """
    if copies < 0:
        raise ValueError(f"copies must be >= 0, got {copies}")
    attr_names = {str(a["name"]) for _, d in dialogues for m in d.get("messages") or [] for a in m.get("attrs") or []}
    pattern = entity_pattern([*kb, *attr_names])
    out = []
    for conv_id, dialogue in dialogues:
        rng = random.Random(f"kdconv-augment/{seed}/{conv_id}")
        entities = dialogue_entities(dialogue, pattern)
        for k in range(copies if entities else 0):  # nothing to swap: no copy
            mapping = swap_mapping(entities, kb, rng)
            out.append((f"{conv_id}-aug{k}", swap_entities(dialogue, mapping, pattern), mapping))
    return out


# --- other KdConv domains (SFT only) ----------------------------------------------------------------

EXTRA_SFT_DOMAINS = ("film", "music")  # KdConv's folders beside travel/
EXTRA_SFT_FILES = ("dev.json", "test.json")
SFT_ONLY = ("train_aug", "extra")  # the prepared files only ``queryrl sft`` reads, in this order
# Baidu Baike's disambiguation after a title: 恋恋笔记本（美国2004年尼克·卡索维茨导演爱情片）
_DISAMBIGUATION = re.compile(r"\s*[（(][^（）()]*[）)]\s*$")
_NAMING = re.compile(r"[\u4e00-\u9fffA-Za-z]")  # a name has a letter or a CJK character, not only digits


def parse_domains(text: str) -> tuple[str, ...]:
    """``film,music`` -> ``("film", "music")``: distinct, in order, each one of :data:`EXTRA_SFT_DOMAINS`;
    ``""``: none. Raises ValueError naming the unknown ones."""
    domains = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [d for d in domains if d not in EXTRA_SFT_DOMAINS]
    if unknown:
        raise ValueError(
            f"unknown KdConv domain {', '.join(map(repr, unknown))} for the extra SFT rows; "
            f"choose from {', '.join(EXTRA_SFT_DOMAINS)} (comma-separated)"
        )
    return domains


def extra_sft_sources(kdconv_root: Path, domains: Sequence[str]) -> list[tuple[str, Path]]:
    """``(domain, file)`` of each of :data:`EXTRA_SFT_FILES` of each domain's folder in `kdconv_root`
    (the travel folder's parent). Raises ValueError for an unknown domain and FileNotFoundError naming
    every missing folder or file at once."""
    domains = parse_domains(",".join(domains))
    sources = [(domain, kdconv_root / domain / name) for domain in domains for name in EXTRA_SFT_FILES]
    missing = sorted({str(p.parent) if not p.parent.is_dir() else str(p) for _, p in sources if not p.is_file()})
    if missing:
        raise FileNotFoundError(
            f"--extra-sft: missing {', '.join(missing)} (each KdConv domain folder, with "
            f"{' and '.join(EXTRA_SFT_FILES)}, sits beside the travel folder, in {kdconv_root})"
        )
    return sources


def attr_entity_names(dialogues: Iterable[Mapping[str, Any]]) -> set[str]:
    """The entity names a KdConv file's messages use in their ``attrs`` (its only knowledge here), each
    also without its trailing disambiguation, which the messages never write (``恋恋笔记本（美国2004年…
    爱情片）`` -> ``恋恋笔记本``); names without a letter or CJK character (``21``, ``？``) are left out."""
    names: set[str] = set()
    for dialogue in dialogues:
        for message in dialogue.get("messages") or []:
            for attr in message.get("attrs") or []:
                name = str(attr.get("name", "")).strip()
                names.update(n for n in (name, _DISAMBIGUATION.sub("", name)) if _NAMING.search(n))
    return names


def extra_sft_rows(
    path: Path, domain: str, history_chars: int, sft_target: str = "reference"
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The SFT rows of one KdConv dialogue file of another domain, and what they hold.

    Like the travel training rows: both speakers ask, the turns whose reply uses knowledge, the
    prompt's domain line of `domain`'s folder, :func:`windowed_rows` with `sft_target`, the reference
    rewriter a :class:`~queryrl.rag.HeuristicRewriter` (``latin_entities=False``) with the file's
    :func:`attr_entity_names` as its dictionary. Conversation ids become ``<domain>-<id>``
    (``film-dev-0003``), distinct from travel's. The info: the conversations, the rows, the dictionary's
    size and the share of rows whose target names one of its entities.
    """
    from queryrl.apps.query_rewrite.conversations import conversations_to_rows
    from queryrl.apps.query_rewrite.kdconv import kdconv_domain, load_kdconv_conversations
    from queryrl.rag import HeuristicRewriter

    raw = json.loads(path.read_text(encoding="utf-8-sig"))
    rewriter = HeuristicRewriter(attr_entity_names(raw), latin_entities=False)
    conversations = load_kdconv_conversations(path, both_speakers=True)
    for conv in conversations:
        conv.id = f"{domain}-{conv.id}"
    rows = conversations_to_rows(conversations, "kdconv", domain=kdconv_domain(path.parent))
    rows = [r for r in rows if r["reward_model"]["ground_truth"]["gold_doc_ids"]]
    windowed_rows(rows, rewriter, history_chars, sft_target)
    named = 0
    if rows and rewriter.entities:
        pattern = entity_pattern(rewriter.entities)  # the rewriter's entities are lowercased
        named = sum(
            bool(pattern.search(json.loads(r["extra_info"]["sft_target"])["rewritten_query"].lower())) for r in rows
        )
    info = {
        "conversations": len({c.id for c in conversations}),
        "rows": len(rows),
        "entities": len(rewriter.entities),
        "target_names_entity": round(named / max(len(rows), 1), 4),
    }
    return rows, info


def prepare(
    kdconv_dir: Path,
    out: Path,
    test_file: Path | None,
    seed: int,
    history_chars: int,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    sft_target: str = "reference",
    augment: int = 0,
    extra_sft: str | Sequence[str] = (),
    answer_format: str = "json",
) -> dict[str, Any]:
    """Write ``train/val/test.parquet`` into `out` (see the module doc); returns their paths and sizes.
    `answer_format`: what every prompt asks for (``json`` or ``text``, :mod:`queryrl.apps.query_rewrite.prompts`).

    With `test_file` (a KdConv dialogue file), ``test.parquet`` holds all its conversations and dev's
    held-out share goes to training. `sft_target` (:func:`windowed_rows`) applies to the train and
    validation rows; the test rows always carry the reference's answer (never read by the evaluation).

    With `augment` K > 0 also ``train_aug.json`` (K entity-swapped copies of each training dialogue,
    :func:`augment_dialogues` with `seed`) and its rows ``train_aug.parquet``, built like the training
    rows; only SFT reads them (their gold ids may name documents the corpus lacks). The result's
    ``augment`` section: the copies, the file, its rows and dialogues, and the share of its gold ids
    that the corpus has.

    With `extra_sft` (domains of :data:`EXTRA_SFT_DOMAINS`, ``"film,music"`` or a sequence; their folders
    are beside `kdconv_dir`) also ``extra.parquet``: :func:`extra_sft_rows` of each domain's ``dev.json``
    and ``test.json``, for SFT only. The result's ``extra_sft`` section: the domains and, with some, the
    file, its rows and each source file's counts (keyed ``<domain>/<file>``).
    """
    from queryrl.apps.query_rewrite.conversations import conversations_to_rows, write_parquet
    from queryrl.apps.query_rewrite.kdconv import kdconv_corpus, kdconv_domain, load_kdconv_conversations
    from queryrl.rag import Document, HeuristicRewriter
    from queryrl.rag.index import title_entities

    if augment < 0:
        raise ValueError(f"augment must be >= 0, got {augment}")
    extra_domains = parse_domains(extra_sft if isinstance(extra_sft, str) else ",".join(extra_sft))
    extra_sources = extra_sft_sources(Path(os.path.abspath(kdconv_dir)).parent, extra_domains)  # fail early
    corpus = kdconv_corpus(kdconv_dir / _kb_name(kdconv_dir))
    docs = [Document(d["doc_id"], d["title"], d["content"]) for d in corpus]
    rewriter = HeuristicRewriter(title_entities(docs), latin_entities=False)
    domain = kdconv_domain(kdconv_dir)
    conversations = load_kdconv_conversations(kdconv_dir / "dev.json", both_speakers=True)
    ids = split_ids([c.id for c in conversations], val_fraction, 0.0 if test_file else test_fraction, seed)
    if test_file is not None:
        ids["test"] = set()
    splits = {name: [c for c in conversations if c.id in members] for name, members in ids.items()}
    if test_file is not None:
        splits["test"] = load_kdconv_conversations(test_file, both_speakers=True)
    info: dict[str, Any] = {"files": {}, "rows": {}, "conversations": {}}
    for name, convs in splits.items():
        rows = conversations_to_rows(convs, "kdconv", domain=domain, answer_format=answer_format)
        rows = [r for r in rows if r["reward_model"]["ground_truth"]["gold_doc_ids"]]
        if not rows:
            raise ValueError(f"split {name!r} has no turn with gold documents")
        windowed_rows(rows, rewriter, history_chars, sft_target if name != "test" else "reference")
        info["files"][name] = str(write_parquet(rows, out / f"{name}.parquet"))
        info["rows"][name] = len(rows)
        info["conversations"][name] = len({c.id for c in convs})
    info["augment"] = {"copies": augment, "seed": seed}
    if augment:
        dev = kdconv_dir / "dev.json"
        raw = json.loads(dev.read_text(encoding="utf-8-sig"))
        raw_ids = [c.id for c in load_kdconv_conversations(dev)]  # one per dialogue, in file order
        train = [(cid, d) for cid, d in zip(raw_ids, raw, strict=True) if cid in ids["train"]]
        augmented = augment_dialogues(train, kb_attributes(corpus), augment, seed)
        out.mkdir(parents=True, exist_ok=True)
        aug_json = out / "train_aug.json"
        aug_json.write_text(json.dumps([d for _, d, _ in augmented], ensure_ascii=False), encoding="utf-8")
        parsed = load_kdconv_conversations(aug_json)  # one per dialogue, in order: ids -> ``id-augK``
        new_ids = {c.id: aug_id for c, (aug_id, _, _) in zip(parsed, augmented, strict=True)}
        aug_convs = load_kdconv_conversations(aug_json, both_speakers=True)
        for conv in aug_convs:
            conv.id = new_ids[conv.id]
        rows = conversations_to_rows(aug_convs, "kdconv", domain=domain)
        rows = [r for r in rows if r["reward_model"]["ground_truth"]["gold_doc_ids"]]
        windowed_rows(rows, rewriter, history_chars, sft_target)
        known = {d["doc_id"] for d in corpus}
        gold = [g for r in rows for g in r["reward_model"]["ground_truth"]["gold_doc_ids"]]
        info["files"]["train_aug"] = str(write_parquet(rows, out / "train_aug.parquet"))
        info["augment"] |= {
            "dialogues_file": str(aug_json),
            "rows": len(rows),
            "dialogues": len(augmented),
            "gold_ids_in_corpus": round(sum(g in known for g in gold) / max(len(gold), 1), 4),
        }
    info["extra_sft"] = {"domains": list(extra_domains)}
    if extra_sources:
        extra: list[dict[str, Any]] = []
        sources: dict[str, Any] = {}
        for extra_domain, path in extra_sources:
            rows, counts = extra_sft_rows(path, extra_domain, history_chars, sft_target)
            extra += rows
            sources[f"{extra_domain}/{path.name}"] = {"path": str(path), **counts}
        if not extra:
            raise ValueError(f"--extra-sft: no turn with gold documents in {', '.join(sources)}")
        info["files"]["extra"] = str(write_parquet(extra, out / "extra.parquet"))
        info["extra_sft"] |= {"file": info["files"]["extra"], "rows": len(extra), "sources": sources}
    return info


def _kb_name(kdconv_dir: Path) -> str:
    """The knowledge-base file beside dev.json (``kb_<domain>.json``)."""
    found = sorted(p.name for p in kdconv_dir.glob("kb_*.json"))
    if not found:
        raise FileNotFoundError(f"{kdconv_dir}: no kb_*.json knowledge base")
    return found[0]


# --- pipeline -------------------------------------------------------------------------------------


def run_stage(name: str, cmd: list[str], log: Path, timings: dict[str, float]) -> None:
    """Run `cmd` in the repo (output to `log` and a short tail on failure); record its wall time."""
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with log.open("w", encoding="utf-8") as f:
        proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=_env(), check=False)
    timings[name] = round(time.perf_counter() - start, 1)
    print(f"[{name}] {timings[name]:.0f} s (log: {log})", flush=True)
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-30:]
        raise RuntimeError(f"stage {name} failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    return env


def last_checkpoint(run_dir: Path) -> Path:
    """The ``checkpoints/step_N`` folder with the largest N."""
    steps = sorted((run_dir / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    if not steps:
        raise FileNotFoundError(f"{run_dir}/checkpoints: no step_* checkpoint")
    return steps[-1]


def goal(systems: dict[str, Any]) -> dict[str, Any]:
    """GRPO's context-dependent Recall@5 against concat_last3's (met: at least :data:`GOAL_FACTOR` times)."""

    def ctx(name: str) -> float | None:
        value = (systems.get(name) or {}).get("context_dependent", {}).get("recall@5")
        return None if value is None else float(value)

    grpo, base = ctx("grpo"), ctx("concat_last3")
    ratio = grpo / base if grpo is not None and base else None
    return {
        "ctx_dep_recall@5": {"grpo": grpo, "concat_last3": base},
        "ratio": ratio,
        "target_ratio": GOAL_FACTOR,
        "met": ratio is not None and ratio >= GOAL_FACTOR,
    }


def atomic_write_json(path: Path, data: Any) -> None:
    """Write `data` as JSON to `path` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, ensure_ascii=False, indent=2)
            f.write("\n")
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def table(systems: dict[str, Any]) -> str:
    """Recall@5 / MRR overall and on the context-dependent turns, one line per system."""
    lines = [f"{'system':<14}{'R@5':>8}{'MRR':>8}{'ctx R@5':>10}{'ctx MRR':>10}{'format':>8}"]
    for name, m in systems.items():
        dep = m.get("context_dependent") or {}
        lines.append(
            f"{name:<14}{m.get('recall@5', float('nan')):>8.3f}{m.get('mrr', float('nan')):>8.3f}"
            f"{dep.get('recall@5', float('nan')):>10.3f}{dep.get('mrr', float('nan')):>10.3f}"
            f"{m.get('format_ok', float('nan')):>8.3f}"
        )
    return "\n".join(lines)


def sft_only_files(files: Mapping[str, str]) -> list[str]:
    """The prepared files that only ``queryrl sft`` reads (:data:`SFT_ONLY` present in `files`)."""
    return [files[name] for name in SFT_ONLY if name in files]


def sft_overrides(files: Mapping[str, str], prompt_loss_weight: float) -> list[str]:
    """The overrides only ``queryrl sft`` gets: the prompt-loss weight and, when `files` has SFT-only rows
    (``train_aug``, ``extra``), the SFT data: the training rows and those. GRPO keeps ``data.train_files``
    (the original rows, whose gold documents are all in the corpus)."""
    out = [f"sft.prompt_loss_weight={prompt_loss_weight}"]
    if extra := sft_only_files(files):
        out.append(f"sft.train_files=[{','.join([files['train'], *extra])}]")
    return out


def tokenizer_datasets(files: Mapping[str, str], with_sft_only: bool) -> list[str]:
    """``model.tiny.corpus_datasets``: the training rows and, with `with_sft_only`, the SFT-only files."""
    return [files["train"], *(sft_only_files(files) if with_sft_only else [])]


def _domains_arg(text: str) -> tuple[str, ...]:
    try:
        return parse_domains(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kdconv-dir", type=Path, default=Path(os.environ.get("KDCONV_DIR", DEFAULT_KDCONV_DIR)))
    parser.add_argument("--work", type=Path, default=WORK, help="run folder (wiped first)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--seed", type=int, default=0, help="the split's seed")
    parser.add_argument("--history-chars", type=int, default=160, help="earlier-message characters in the prompt")
    parser.add_argument(
        "--sft-target",
        choices=("reference", "gold"),
        default="reference",
        help="SFT targets: the entity-aware reference rewriter's answers, or built from the gold documents",
    )
    parser.add_argument(
        "--augment",
        type=_non_negative_int,
        default=0,
        metavar="K",
        help="K entity-swapped copies of each training dialogue (train_aug.parquet), for SFT only; 0: none",
    )
    parser.add_argument(
        "--sft-prompt-loss",
        type=float,
        default=0.0,
        metavar="W",
        help="sft.prompt_loss_weight: SFT also learns the prompt tokens with weight W (0: the target only)",
    )
    parser.add_argument(
        "--extra-sft",
        type=_domains_arg,
        default=(),
        metavar="DOMAINS",
        help="KdConv domains beside travel (film,music) whose dev and test conversations become SFT-only rows "
        "(extra.parquet); default: none",
    )
    parser.add_argument(
        "--tokenizer-extra",
        action="store_true",
        help="train the tokenizer (model.tiny.corpus_datasets) on the SFT-only files too (train_aug, extra)",
    )
    parser.add_argument("--sft-steps", type=int, default=None, help="default: the config's sft.max_steps")
    parser.add_argument("--grpo-steps", type=int, default=None, help="default: the config's trainer.total_steps")
    parser.add_argument("overrides", nargs="*", help="extra config overrides (key=value) for sft and train")
    args = parser.parse_args(argv)
    if args.tokenizer_extra and not (args.extra_sft or args.augment):
        parser.error(
            "--tokenizer-extra adds the SFT-only files to the tokenizer's corpus: give --extra-sft or --augment"
        )

    kdconv_dir: Path = args.kdconv_dir
    if not (kdconv_dir / "dev.json").exists():
        print(f"SKIP: KdConv not found ({kdconv_dir / 'dev.json'} is absent); set KDCONV_DIR to the travel folder")
        return 0
    try:
        extra_sft_sources(Path(os.path.abspath(kdconv_dir)).parent, args.extra_sft)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 2
    test_env = os.environ.get("KDCONV_TEST")
    test_file = Path(test_env) if test_env else None
    if test_file is not None and not test_file.exists():
        print(f"KDCONV_TEST={test_env}: file not found", file=sys.stderr)
        return 2
    kb = kdconv_dir / _kb_name(kdconv_dir)

    work: Path = args.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "logs").mkdir(parents=True)
    timings: dict[str, float] = {}
    start = time.perf_counter()
    data = prepare(
        kdconv_dir,
        work / "data",
        test_file,
        args.seed,
        args.history_chars,
        sft_target=args.sft_target,
        augment=args.augment,
        extra_sft=args.extra_sft,
    )
    timings["prepare"] = round(time.perf_counter() - start, 1)
    print(f"[prepare] rows {data['rows']}, conversations {data['conversations']}", flush=True)
    if args.augment:
        print(f"[prepare] augmentation {data['augment']}", flush=True)
    if args.extra_sft:
        print(f"[prepare] extra SFT rows {data['extra_sft']}", flush=True)

    files = data["files"]
    tokenizer = tokenizer_datasets(files, args.tokenizer_extra)  # every stage: one tokenizer
    settings = [
        *([f"sft.max_steps={args.sft_steps}"] if args.sft_steps is not None else []),
        *([f"trainer.total_steps={args.grpo_steps}"] if args.grpo_steps is not None else []),
        *args.overrides,
    ]
    common = [
        f"trainer.output_dir={work.parent}",
        f"trainer.experiment_name={work.name}",
        f"model.tiny.corpus_datasets=[{','.join(tokenizer)}]",
        f"data.train_files=[{files['train']}]",
        f"data.val_files=[{files['val']}]",
        f"app.query_rewrite.rag.corpus=kdconv:{kb}",
    ]
    sft_settings = sft_overrides(files, args.sft_prompt_loss)  # before the user's overrides, which win
    queryrl = str(Path(sys.executable).parent / "queryrl")
    logs = work / "logs"
    sft = [queryrl, "sft", "--config", str(CONFIG), *common, *sft_settings, *settings]
    run_stage("sft", sft, logs / "sft.log", timings)
    train = [queryrl, "train", "--config", str(CONFIG), *common, *settings]
    train += [f"model.path={work / 'sft'}", "trainer.resume=disable"]
    run_stage("grpo", train, logs / "grpo.log", timings)
    export = [queryrl, "export", str(last_checkpoint(work)), str(work / "grpo")]
    run_stage("export", export, logs / "export.log", timings)
    eval_json = work / "eval" / "eval.json"
    systems = f"raw_turn,concat_last3,reference,sft={work / 'sft'},grpo={work / 'grpo'}"
    evaluate = [queryrl, "eval", "--config", str(CONFIG), "--data", files["test"], "--systems", systems]
    evaluate += ["--corpus", f"kdconv:{kb}", "--out", str(eval_json)]
    run_stage("eval", evaluate, logs / "eval.log", timings)
    timings["total"] = round(time.perf_counter() - start, 1)

    report = json.loads(eval_json.read_text(encoding="utf-8"))
    report["eval_file"] = str(test_file) if test_file is not None else report["eval_file"]
    report["goal"] = goal(report["systems"])
    report["bench"] = {
        "config": str(CONFIG.relative_to(REPO)),
        "kdconv_dir": str(kdconv_dir),
        "test": "KDCONV_TEST" if test_file is not None else "held-out dev conversations (10 %)",
        "eval_rows_file": files["test"],
        "split_seed": args.seed,
        "history_chars": args.history_chars,
        "sft_target": args.sft_target,
        "overrides": settings,
        "sft_overrides": sft_settings,
        "sft_prompt_loss_weight": args.sft_prompt_loss,
        "augment": data["augment"],
        "extra_sft": data["extra_sft"],
        "tokenizer_datasets": tokenizer,
        "rows": data["rows"],
        "conversations": data["conversations"],
        "wall_time_s": timings,
        "cpu_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    atomic_write_json(args.out, report)

    print(table(report["systems"]))
    g = report["goal"]
    grpo, base = g["ctx_dep_recall@5"]["grpo"], g["ctx_dep_recall@5"]["concat_last3"]
    verdict = "MET" if g["met"] else "NOT met"
    ratio = "n/a" if g["ratio"] is None else f"{g['ratio']:.2f}x"
    print(
        f"goal {verdict}: grpo context-dependent Recall@5 {grpo:.3f} vs concat_last3 {base:.3f} = {ratio} "
        f"(target {GOAL_FACTOR:.1f}x, i.e. >= {GOAL_FACTOR * (base or 0):.3f})"
    )
    print(f"wall time {timings['total']:.0f} s; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
