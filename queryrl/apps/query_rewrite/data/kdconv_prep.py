"""KdConv prepared for the query rewriter: the splits, the history window, the SFT targets, entity-swap
augmentation and the other domains' SFT-only rows (the data step of ``make bench-kdconv``, which only runs it).

- :func:`prepare` writes ``train/val/test.parquet`` (and ``train_aug.parquet``, ``extra.parquet``: rows only
  ``queryrl sft`` reads) from a KdConv folder: conversations split by id (seeded), both speakers asking, only
  turns whose reply uses the knowledge base; the policy's prompt shows the most recent history
  (:func:`history_window`), ``extra_info.contexts`` the whole conversation; the SFT target is the reference
  rewriter's answer or one built from the gold documents (:mod:`~.kdconv_targets`); test rows never carry
  gold-derived text.
- :func:`augment_dialogues`: entity-swapped copies of the training dialogues (every knowledge-base entity a
  dialogue mentions replaced everywhere, longest first, by another with the attributes it uses).
- :func:`extra_sft_rows`: the turns of KdConv's film and music files, with their own entity names.

``benchmarks/kdconv.py``'s docstring describes the whole benchmark these feed.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from queryrl.apps.query_rewrite.data.kdconv import kdconv_missing
from queryrl.apps.query_rewrite.data.kdconv_targets import (  # re-exported: the targets prepare() builds
    GOLD_TARGETS,
)

# --- data -----------------------------------------------------------------------------------------


def split_ids(
    ids: Sequence[str], val_fraction: float, test_fraction: float, seed: int, fold: tuple[int, int] | None = None
) -> dict[str, set[str]]:
    """Conversation ids -> train/val/test sets: sorted, shuffled with `seed`, cut (rounded shares).

    With `fold` ``(k, n)`` the fractions are not used: the shuffled ids are cut into `n` contiguous parts of
    near-equal size (:func:`fold_parts`), and part `k` is the test set, part ``k + 1`` (mod `n`) the validation
    set, the rest training. Over ``k = 0 .. n - 1`` with one seed every conversation is held out for testing exactly
    once and for validation once (cross-validation), where split seeds draw test sets that overlap.
    """
    if val_fraction < 0 or test_fraction < 0 or val_fraction + test_fraction >= 1:
        raise ValueError(f"need 0 <= val_fraction, test_fraction and a sum < 1, got {val_fraction}, {test_fraction}")
    ordered = sorted(set(ids))
    random.Random(seed).shuffle(ordered)
    if fold is not None:
        parts = fold_parts(ordered, *fold)
        k, n = fold
        return {
            "val": set(parts[(k + 1) % n]),
            "test": set(parts[k]),
            "train": {i for j, part in enumerate(parts) if j not in (k, (k + 1) % n) for i in part},
        }
    n_val, n_test = round(len(ordered) * val_fraction), round(len(ordered) * test_fraction)
    return {
        "val": set(ordered[:n_val]),
        "test": set(ordered[n_val : n_val + n_test]),
        "train": set(ordered[n_val + n_test :]),
    }


def fold_parts(ordered: Sequence[str], k: int, n: int) -> list[list[str]]:
    """`ordered` cut into `n` contiguous parts whose sizes differ by at most one (the first ones larger); `k` is
    checked: ``0 <= k < n``, and ``3 <= n <= len(ordered)`` (a test part, a validation part and training)."""
    if not 3 <= n <= len(ordered):
        raise ValueError(f"a fold split needs 3 to {len(ordered)} folds (test, validation, training), got {n}")
    if not 0 <= k < n:
        raise ValueError(f"the fold must be 0 to {n - 1}, got {k}")
    size, extra = divmod(len(ordered), n)
    starts = [i * size + min(i, extra) for i in range(n + 1)]
    return [list(ordered[starts[i] : starts[i + 1]]) for i in range(n)]


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


def windowed_rows(
    rows: list[dict[str, Any]], rewriter: Any, max_chars: int, sft_target: str = "reference", lang: str = "zh"
) -> list[dict[str, Any]]:
    """`rows` with the prompt built from :func:`history_window` of the contexts and the SFT target on
    that same window (what the policy can see); rows are changed in place.

    `sft_target`: ``reference`` (`rewriter`'s answer) or a target built from the row's gold documents
    (:data:`~.kdconv_targets.GOLD_TARGETS`; fine for training rows, whose labels the GRPO reward uses anyway).
    """
    from queryrl.apps.query_rewrite.data.sft_targets import (
        SFT_SOURCE_KEY,
        SFT_TARGET_KEY,
        reference_target,
        render_answer,
    )
    from queryrl.apps.query_rewrite.prompts import build_messages
    from queryrl.apps.query_rewrite.reward.modes import parse_answer

    if sft_target != "reference" and sft_target not in GOLD_TARGETS:
        raise ValueError(f"unknown sft_target {sft_target!r}; use reference, {' or '.join(GOLD_TARGETS)}")
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
        if sft_target in GOLD_TARGETS:
            parsed = parse_answer(target, answer_format=info.get("answer_format") or "json")
            assert parsed is not None  # the reference's own answer
            gold = list(row["reward_model"]["ground_truth"]["gold_doc_ids"])
            summary = str(info.get("history_summary") or "")  # shown in the prompt too: a name it lists is seen
            seen = [{"role": "user", "content": summary}, *window] if summary else window
            carried = {
                "rewritten_query": GOLD_TARGETS[sft_target](seen, gold, parsed.rewritten_query),
                "user_profile": info.get("user_profile", ""),
                "history_summary": info.get("history_summary", ""),
            }
            target = render_answer(carried, info)
        info[SFT_TARGET_KEY] = target
        gold_made = f"the query made of the turn's gold (sft_target={sft_target})"
        info[SFT_SOURCE_KEY] = gold_made if sft_target in GOLD_TARGETS else f"rewriter {type(rewriter).__name__}"
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
    """Entity name -> its attributes, from :func:`~queryrl.apps.query_rewrite.data.kdconv.kdconv_corpus`'s
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
            f"--extra-sft: {kdconv_missing(', '.join(missing), None)} (each KdConv domain folder, with "
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
    from queryrl.apps.query_rewrite.data.conversations import conversations_to_rows
    from queryrl.apps.query_rewrite.data.kdconv import kdconv_domain, load_kdconv_conversations
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
    fold: tuple[int, int] | None = None,
    mentions: int = 0,
) -> dict[str, Any]:
    """Write ``train/val/test.parquet`` into `out` (see the module doc); returns their paths and sizes.
    `answer_format`: what every prompt asks for (``json`` or ``text``, :mod:`queryrl.apps.query_rewrite.prompts`).

    With `test_file` (a KdConv dialogue file), ``test.parquet`` holds all its conversations and dev's
    held-out share goes to training. With `fold` ``(k, n)`` (not with `test_file`) the split is fold `k` of `n`
    (:func:`split_ids`). `sft_target` (:func:`windowed_rows`) applies to the train and
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

    With `mentions` N > 0 every split's prompts carry a history summary of the knowledge base's names the
    conversation mentioned before the turn, the latest N (:mod:`~queryrl.apps.query_rewrite.data.mentions`);
    not with `augment` or `extra_sft`, whose rows would lack it.
    """
    from queryrl.apps.query_rewrite.data.conversations import conversations_to_rows, write_parquet
    from queryrl.apps.query_rewrite.data.kdconv import kdconv_corpus, kdconv_domain, load_kdconv_conversations
    from queryrl.apps.query_rewrite.data.mentions import add_mentions, mention_names
    from queryrl.rag import Document, HeuristicRewriter
    from queryrl.rag.index import title_entities

    if augment < 0:
        raise ValueError(f"augment must be >= 0, got {augment}")
    if mentions < 0 or (mentions and (augment or extra_sft)):
        raise ValueError(f"mentions must be >= 0 and go without augment and extra_sft, got {mentions}")
    if fold is not None and test_file is not None:
        raise ValueError("a fold split holds its test conversations out of dev.json; give no test_file with it")
    extra_domains = parse_domains(extra_sft if isinstance(extra_sft, str) else ",".join(extra_sft))
    extra_sources = extra_sft_sources(Path(os.path.abspath(kdconv_dir)).parent, extra_domains)  # fail early
    corpus = kdconv_corpus(kdconv_dir / kb_name(kdconv_dir))
    docs = [Document(d["doc_id"], d["title"], d["content"]) for d in corpus]
    rewriter = HeuristicRewriter(title_entities(docs), latin_entities=False)
    domain = kdconv_domain(kdconv_dir)
    conversations = load_kdconv_conversations(kdconv_dir / "dev.json", both_speakers=True)
    ids = split_ids([c.id for c in conversations], val_fraction, 0.0 if test_file else test_fraction, seed, fold)
    if test_file is not None:
        ids["test"] = set()
    splits = {name: [c for c in conversations if c.id in members] for name, members in ids.items()}
    if test_file is not None:
        splits["test"] = load_kdconv_conversations(test_file, both_speakers=True)
    info: dict[str, Any] = {"files": {}, "rows": {}, "conversations": {}}
    info["split"] = {"seed": seed, "fold": list(fold) if fold is not None else None}
    info["mentions"] = mentions
    names = entity_pattern(mention_names(d["title"] for d in corpus)) if mentions else None
    for name, convs in splits.items():
        rows = conversations_to_rows(convs, "kdconv", domain=domain, answer_format=answer_format)
        rows = [r for r in rows if r["reward_model"]["ground_truth"]["gold_doc_ids"]]
        if not rows:
            raise ValueError(f"split {name!r} has no turn with gold documents")
        if names is not None:
            add_mentions(rows, names, mentions)
        windowed_rows(rows, rewriter, history_chars, sft_target if name != "test" else "reference")
        info["files"][name] = str(write_parquet(rows, out / f"{name}.parquet"))
        info["rows"][name] = len(rows)
        info["conversations"][name] = len({c.id for c in convs})
    info["augment"] = {"copies": augment, "seed": seed}
    if augment:
        where = (kdconv_dir, out, domain)
        info["augment"] |= _write_augmented(
            where, ids["train"], corpus, rewriter, augment, seed, history_chars, sft_target
        )
        info["files"]["train_aug"] = info["augment"].pop("file")
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


def kb_name(kdconv_dir: Path) -> str:
    """The knowledge-base file beside dev.json (``kb_<domain>.json``)."""
    found = sorted(p.name for p in kdconv_dir.glob("kb_*.json"))
    if not found:
        raise FileNotFoundError(f"{kdconv_dir}: no kb_*.json knowledge base")
    return found[0]


def _write_augmented(
    where: tuple[Path, Path, str],
    train_ids: Collection[str],
    corpus: list[dict[str, Any]],
    rewriter: Any,
    augment: int,
    seed: int,
    history_chars: int,
    sft_target: str,
) -> dict[str, Any]:
    """``train_aug.json`` and ``train_aug.parquet`` in `out` of `where` (the KdConv folder, `out`, the domain
    line): `augment` entity-swapped copies of each training dialogue, as rows like the training rows.
    Returns the ``augment`` section of :func:`prepare`'s result, with the parquet's path under ``file``."""
    from queryrl.apps.query_rewrite.data.conversations import conversations_to_rows, write_parquet
    from queryrl.apps.query_rewrite.data.kdconv import load_kdconv_conversations

    kdconv_dir, out, domain = where
    dev = kdconv_dir / "dev.json"
    raw = json.loads(dev.read_text(encoding="utf-8-sig"))
    raw_ids = [c.id for c in load_kdconv_conversations(dev)]  # one per dialogue, in file order
    train = [(cid, d) for cid, d in zip(raw_ids, raw, strict=True) if cid in train_ids]
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
    return {
        "file": str(write_parquet(rows, out / "train_aug.parquet")),
        "dialogues_file": str(aug_json),
        "rows": len(rows),
        "dialogues": len(augmented),
        "gold_ids_in_corpus": round(sum(g in known for g in gold) / max(len(gold), 1), 4),
    }
