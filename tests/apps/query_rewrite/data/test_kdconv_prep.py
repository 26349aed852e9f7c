"""KdConv prepared for the query rewriter (queryrl/apps/query_rewrite/data/kdconv_prep.py) on a small slice of
KdConv travel: the splits, the window, the SFT targets, entity-swap augmentation, the other domains' rows."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest

from queryrl.apps.query_rewrite.data import kdconv_prep as prep
from queryrl.apps.query_rewrite.data import kdconv_targets as targets
from tests.helpers import KDCONV, needs_kdconv

REPO = Path(__file__).resolve().parents[4]


def test_split_ids_is_seeded_disjoint_and_complete() -> None:
    ids = [f"dev-{i:04d}" for i in range(50)] * 2  # both-speaker copies share an id
    a = prep.split_ids(ids, 0.1, 0.1, seed=3)
    assert a == prep.split_ids(list(reversed(ids)), 0.1, 0.1, seed=3)
    assert {k: len(v) for k, v in a.items()} == {"val": 5, "test": 5, "train": 40}
    assert a["train"] | a["val"] | a["test"] == set(ids)
    assert not (a["train"] & a["val"])
    assert not (a["train"] & a["test"])
    assert not (a["val"] & a["test"])
    assert prep.split_ids(ids, 0.1, 0.1, seed=4) != a
    with pytest.raises(ValueError, match="sum < 1"):
        prep.split_ids(ids, 0.5, 0.5, seed=0)


def test_fold_splits_test_every_conversation_once_and_validate_it_once() -> None:
    ids = [f"dev-{i:04d}" for i in range(150)] * 2
    splits = [prep.split_ids(ids, 0.1, 0.1, seed=0, fold=(k, 10)) for k in range(10)]
    for a in splits:
        assert {name: len(members) for name, members in a.items()} == {"val": 15, "test": 15, "train": 120}
        assert a["train"] | a["val"] | a["test"] == set(ids)
        assert len(a["train"]) + len(a["val"]) + len(a["test"]) == 150  # with the union complete: disjoint
    tested = [i for a in splits for i in a["test"]]
    validated = [i for a in splits for i in a["val"]]
    assert sorted(tested) == sorted(validated) == sorted(set(ids))  # each id once in each role
    assert splits[3]["val"] == splits[4]["test"]  # part K + 1 validates fold K
    assert splits[9]["val"] == splits[0]["test"]
    assert prep.split_ids(ids, 0.3, 0.3, seed=0, fold=(2, 10)) == splits[2]  # the fractions are not used
    assert prep.split_ids(ids, 0.1, 0.1, seed=1, fold=(2, 10)) != splits[2]
    assert [len(part) for part in prep.fold_parts([str(i) for i in range(23)], 0, 5)] == [5, 5, 5, 4, 4]
    with pytest.raises(ValueError, match="the fold must be 0 to 9, got 10"):
        prep.split_ids(ids, 0.1, 0.1, seed=0, fold=(10, 10))
    with pytest.raises(ValueError, match="needs 3 to 150 folds"):
        prep.split_ids(ids, 0.1, 0.1, seed=0, fold=(0, 2))


def test_a_fold_split_refuses_a_separate_test_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="give no test_file with it"):
        prep.prepare(tmp_path / "kdconv", tmp_path / "out", tmp_path / "test.json", 0, 320, fold=(0, 10))
    assert not (tmp_path / "out").exists()


def test_history_window_keeps_recent_messages_within_budget() -> None:
    contexts = [{"role": r, "content": c} for r, c in [("user", "a" * 50), ("assistant", "b" * 30), ("user", "c")]]
    assert [m["content"] for m in prep.history_window(contexts, 40)] == ["b" * 30, "c"]
    assert len(prep.history_window(contexts, 100)) == 3
    # the previous message is kept whatever its length
    assert [m["content"] for m in prep.history_window(contexts, 1)] == ["b" * 30, "c"]


def _travel_slice(folder: Path, dialogues: int) -> Path:
    """`folder` made a KdConv travel folder: the first `dialogues` of dev.json and the knowledge base."""
    folder.mkdir(parents=True)
    part = json.loads((KDCONV / "dev.json").read_text(encoding="utf-8"))[:dialogues]
    (folder / "dev.json").write_text(json.dumps(part, ensure_ascii=False), encoding="utf-8")
    (folder / "kb_travel.json").symlink_to(KDCONV / "kb_travel.json")
    return folder


@needs_kdconv("travel/dev.json")
def test_prepare_on_a_small_slice(tmp_path: Path) -> None:
    src = _travel_slice(tmp_path / "travel", 20)
    dialogues = json.loads((src / "dev.json").read_text(encoding="utf-8"))
    info = prep.prepare(src, tmp_path / "data", None, seed=0, history_chars=120)
    assert info["conversations"] == {"val": 2, "test": 2, "train": 16}
    frames = {name: pd.read_parquet(path) for name, path in info["files"].items()}
    ids = {name: set(f["extra_info"].map(lambda e: e["conversation_id"])) for name, f in frames.items()}
    assert not (ids["train"] & ids["test"])
    assert not (ids["train"] & ids["val"])
    assert not (ids["val"] & ids["test"])
    row = frames["train"].iloc[3]
    info_row = row["extra_info"]
    assert len(row["reward_model"]["ground_truth"]["gold_doc_ids"]) > 0
    target = json.loads(info_row["sft_target"])
    # the rows ask for the query only (the default answer_fields): the target has exactly that field
    assert list(target) == list(info_row["answer_fields"]) == ["rewritten_query"]
    # the prompt shows a window of the history; the contexts keep the whole conversation
    assert info_row["prompt_messages"] <= len(info_row["contexts"])
    assert row["prompt"][-1]["content"].endswith(info_row["contexts"][-1]["content"])

    # KDCONV_TEST: the given file is the test split, dev's held-out share goes to training
    test_file = tmp_path / "test.json"
    test_file.write_text(json.dumps(dialogues[:3], ensure_ascii=False), encoding="utf-8")
    info = prep.prepare(src, tmp_path / "data2", test_file, seed=0, history_chars=120)
    assert info["conversations"] == {"val": 2, "test": 3, "train": 18}


def test_gold_query_uses_a_visible_gold_entity_and_its_attributes() -> None:
    window = [
        {"role": "user", "content": "你知道古北水镇吗？"},
        {"role": "assistant", "content": "知道。"},
        {"role": "user", "content": "那多少钱？"},
    ]
    gold = ["古北水镇::门票", "古北水镇::地址", "故宫::门票"]
    assert targets.gold_query(window, gold, "ref") == "古北水镇 那多少钱？ 门票 地址"
    # an entity the window does not show is not invented: the reference's query is the base
    assert targets.gold_query(window[1:], gold, "ref 那多少钱？") == "ref 那多少钱？ 门票 地址"
    assert targets.gold_query(window, ["古北水镇::Information"], "ref") == "古北水镇 那多少钱？ Information"


def test_gold_entity_query_names_a_visible_gold_entity_after_the_turn() -> None:
    window = [
        {"role": "user", "content": "你知道古北水镇吗？"},
        {"role": "assistant", "content": "知道。"},
        {"role": "user", "content": "那多少钱？"},
    ]
    gold = ["古北水镇::门票", "古北水镇::地址"]
    # the turn as the customer wrote it, then the entity: no attribute words the conversation never had
    assert targets.gold_entity_query(window, gold, "ref") == "那多少钱？ 古北水镇"
    # a turn that names the entity stays as it is
    named = [*window[:2], {"role": "user", "content": "古北水镇多少钱？"}]
    assert targets.gold_entity_query(named, gold, "ref") == "古北水镇多少钱？"
    # an entity outside the window is not invented: the reference's query
    assert targets.gold_entity_query(window[1:], gold, "ref 那多少钱？") == "ref 那多少钱？"


def test_question_entity_query_leaves_out_what_the_turn_tells() -> None:
    window = [
        {"role": "user", "content": "古北水镇的电话是多少？"},
        {"role": "assistant", "content": "不清楚，你知道吗？"},
        {"role": "user", "content": "电话是010-81009999，那它几点开门？"},
    ]
    gold = ["古北水镇::开放时间"]
    # the told phone number goes (it pulls the phone document up), the question stays, the entity follows
    assert targets.question_entity_query(window, gold, "ref") == "那它几点开门？ 古北水镇"
    assert targets.gold_entity_query(window, gold, "ref") == "电话是010-81009999，那它几点开门？ 古北水镇"
    # a turn that only asks, or only tells, is the gold-entity target as it was
    for turn in ("那它几点开门？", "电话是010-81009999"):
        plain = [*window[:2], {"role": "user", "content": turn}]
        assert targets.question_entity_query(plain, gold, "ref") == targets.gold_entity_query(plain, gold, "ref")


@needs_kdconv("travel/dev.json")
def test_question_attribute_query_adds_the_field_name_the_turn_asks_for() -> None:
    window = [
        {"role": "user", "content": "古北水镇的门票多少钱？"},
        {"role": "assistant", "content": "150元。"},
        {"role": "user", "content": "电话是010-81009999，这里能玩多久呀？"},
    ]
    # the turn asks the visiting time in its own words: the knowledge base's field name follows the entity
    asked = ["古北水镇::建议游玩时间"]
    assert targets.question_attribute_query(window, asked, "ref") == "这里能玩多久呀？ 古北水镇 建议游玩时间"
    # a field the turn does not ask (the nearby sights) would add a question: the target stays without it
    other = ["古北水镇::周边景点"]
    assert targets.question_attribute_query(window, other, "ref") == targets.question_entity_query(window, other, "ref")
    # nor one only the history asked, nor the description (no question type, out of BM25's reach)
    told = [*window[:2], {"role": "user", "content": "好的，我下次去看看。"}]
    assert targets.question_attribute_query(told, ["古北水镇::门票"], "ref") == "好的，我下次去看看。 古北水镇"
    described = [*window[:2], {"role": "user", "content": "你知道古北水镇吗？"}]
    assert targets.question_attribute_query(described, ["古北水镇::Information"], "ref") == "你知道古北水镇吗？"
    # a field name the turn already has is not repeated
    named = [*window[:2], {"role": "user", "content": "那它的门票呢？"}]
    ticket = ["古北水镇::门票"]
    assert targets.question_attribute_query(named, ticket, "ref") == "那它的门票呢？ 古北水镇"
    assert "question_attribute" in targets.GOLD_TARGETS


def test_prepare_with_gold_entity_targets(tmp_path: Path) -> None:
    src = _travel_slice(tmp_path / "travel", 20)
    kinds = {}
    for target in ("reference", "gold_entity"):
        info = prep.prepare(src, tmp_path / target, None, seed=0, history_chars=120, sft_target=target)
        kinds[target] = pd.read_parquet(info["files"]["train"])
    changed = 0
    for (_, ref), (_, row) in zip(kinds["reference"].iterrows(), kinds["gold_entity"].iterrows(), strict=True):
        gold = list(row["reward_model"]["ground_truth"]["gold_doc_ids"])
        query = json.loads(row["extra_info"]["sft_target"])["rewritten_query"]
        window = row["extra_info"]["contexts"][-row["extra_info"]["prompt_messages"] :]
        entity = gold[0].split("::", 1)[0]
        if any(entity in m["content"] for m in window):
            assert entity in query
            assert query.startswith(window[-1]["content"].strip())
        else:
            assert row["extra_info"]["sft_target"] == ref["extra_info"]["sft_target"]
        changed += row["extra_info"]["sft_target"] != ref["extra_info"]["sft_target"]
    assert changed > 0  # where the reference names another entity or none
    with pytest.raises(ValueError, match="gold_entity"):
        prep.prepare(src, tmp_path / "bad", None, seed=0, history_chars=120, sft_target="entity")


# --- entity-swap augmentation ---------------------------------------------------------------------

ALL_ATTRS = frozenset({"Information", "地址", "门票"})
TOY_KB = {
    "北京故宫": ALL_ATTRS,
    "故宫": ALL_ATTRS,
    "故宫角楼": ALL_ATTRS,
    "颐和园": ALL_ATTRS,
    "天坛": ALL_ATTRS,
    "香山公园": ALL_ATTRS,
    "景山公园": frozenset({"Information"}),
    "北海公园": ALL_ATTRS,
    "雍和宫": ALL_ATTRS,
}


def _toy_dialogue() -> dict[str, object]:
    return {
        "name": "北京故宫",
        "messages": [
            {"message": "你知道北京故宫吗？"},
            {
                "message": "知道，北京故宫又叫故宫，旁边是景山公园。",
                "attrs": [{"name": "北京故宫", "attrname": "Information", "attrvalue": "北京故宫，近景山公园"}],
            },
            {"message": "故宫的门票多少钱？故宫角楼呢？"},
            {"message": "60元。", "attrs": [{"name": "故宫", "attrname": "门票", "attrvalue": "60元"}]},
        ],
    }


def test_swap_entities_replaces_every_mention_longest_first() -> None:
    pattern = prep.entity_pattern(TOY_KB)
    dialogue = _toy_dialogue()
    # 北京故宫 and 故宫角楼 are entities of their own, not 故宫 in them; the attributes come from attrs
    found = prep.dialogue_entities(dialogue, pattern)
    assert found == {"北京故宫": {"Information"}, "故宫": {"门票"}, "景山公园": set(), "故宫角楼": set()}
    assert list(found) == ["北京故宫", "故宫", "景山公园", "故宫角楼"]  # in order of first mention
    mapping = {"北京故宫": "颐和园", "故宫": "天坛", "景山公园": "香山公园", "故宫角楼": "北海公园"}
    swapped = prep.swap_entities(dialogue, mapping, pattern)
    assert [m["message"] for m in swapped["messages"]] == [
        "你知道颐和园吗？",
        "知道，颐和园又叫天坛，旁边是香山公园。",
        "天坛的门票多少钱？北海公园呢？",
        "60元。",
    ]
    assert swapped["name"] == "颐和园"
    assert swapped["messages"][1]["attrs"] == [
        {"name": "颐和园", "attrname": "Information", "attrvalue": "颐和园，近香山公园"}
    ]
    assert swapped["messages"][3]["attrs"] == [{"name": "天坛", "attrname": "门票", "attrvalue": "60元"}]
    assert dialogue == _toy_dialogue()  # the original is not changed
    # an entity outside the mapping stays, and a longer name is never split to swap a shorter one
    assert prep.swap_entities(dialogue, {"故宫": "天坛"}, pattern)["messages"][0]["message"] == "你知道北京故宫吗？"


def test_swap_mapping_draws_distinct_unrelated_entities_with_the_used_attributes() -> None:
    entities = {"北京故宫": {"Information"}, "故宫": {"门票"}, "景山公园": set()}  # 故宫角楼 is not free
    for seed in range(30):
        mapping = prep.swap_mapping(entities, TOY_KB, random.Random(seed))
        assert list(mapping) == list(entities)
        new = list(mapping.values())
        assert len(set(new)) == len(new)
        for name in new:
            # neither an original nor containing / contained in one (故宫 vs 北京故宫, 故宫角楼)
            assert not any(name in old or old in name for old in entities)
        assert "门票" in TOY_KB[mapping["故宫"]]
    # 门票 is wanted but only 景山公园 is free: it is taken anyway (SFT-only rows); nothing free: an error
    kb = {"故宫": ALL_ATTRS, "景山公园": frozenset({"Information"})}
    assert prep.swap_mapping({"故宫": {"门票"}}, kb, random.Random(0)) == {"故宫": "景山公园"}
    with pytest.raises(ValueError, match="no knowledge-base entity"):
        prep.swap_mapping({"故宫": set()}, {"故宫": ALL_ATTRS, "北京故宫": ALL_ATTRS}, random.Random(0))


def test_augment_dialogues_is_seeded() -> None:
    dialogues = [("dev-0000", _toy_dialogue()), ("dev-0001", {"messages": [{"message": "你好"}]})]
    a = prep.augment_dialogues(dialogues, TOY_KB, 4, seed=0)
    assert a == prep.augment_dialogues(dialogues, TOY_KB, 4, seed=0)
    # the dialogue without an entity gets no copy; ids name the source and the copy
    assert [cid for cid, _, _ in a] == [f"dev-0000-aug{k}" for k in range(4)]
    assert len({tuple(m.items()) for _, _, m in a}) > 1  # the copies differ
    assert prep.augment_dialogues(dialogues, TOY_KB, 2, seed=0) == a[:2]
    assert any(prep.augment_dialogues(dialogues, TOY_KB, 4, seed=s) != a for s in range(1, 4))
    assert prep.augment_dialogues(dialogues, TOY_KB, 0, seed=0) == []
    with pytest.raises(ValueError, match=">= 0"):
        prep.augment_dialogues(dialogues, TOY_KB, -1, seed=0)


@needs_kdconv("travel/dev.json")
def test_prepare_augments_only_the_training_split(tmp_path: Path) -> None:
    from queryrl.apps.query_rewrite.data.kdconv import kdconv_corpus

    src = _travel_slice(tmp_path / "travel", 10)
    dialogues = json.loads((src / "dev.json").read_text(encoding="utf-8"))
    plain = prep.prepare(src, tmp_path / "plain", None, seed=0, history_chars=120)
    assert "train_aug" not in plain["files"]
    assert plain["augment"] == {"copies": 0, "seed": 0}
    info = prep.prepare(src, tmp_path / "aug", None, seed=0, history_chars=120, augment=2)
    assert info["rows"] == plain["rows"]
    frames = {name: pd.read_parquet(path) for name, path in info["files"].items()}
    # validation and test rows are those of the run without augmentation
    for name in ("train", "val", "test"):
        pd.testing.assert_frame_equal(frames[name], pd.read_parquet(plain["files"][name]))
    train_ids = set(frames["train"]["extra_info"].map(lambda e: e["conversation_id"]))
    aug = frames["train_aug"]
    assert info["augment"]["rows"] == len(aug) > len(frames["train"])
    assert info["augment"]["dialogues"] == 2 * len(train_ids)
    assert info["augment"]["gold_ids_in_corpus"] > 0.9

    # every augmented row is a copy of a training row with its entities swapped, gold ids included
    corpus = kdconv_corpus(KDCONV / "kb_travel.json")
    kb = prep.kb_attributes(corpus)
    train_dialogues = [(f"dev-{i:04d}", d) for i, d in enumerate(dialogues) if f"dev-{i:04d}" in train_ids]
    mappings = {cid: m for cid, _, m in prep.augment_dialogues(train_dialogues, kb, 2, seed=0)}
    assert set(aug["extra_info"].map(lambda e: e["conversation_id"])) == set(mappings)
    source = {
        (e["conversation_id"], e["turn_index"], tuple(g)): e
        for e, g in zip(
            frames["train"]["extra_info"],
            frames["train"]["reward_model"].map(lambda r: list(r["ground_truth"]["gold_doc_ids"])),
            strict=True,
        )
    }
    replaced = 0
    for info_row, reward in zip(aug["extra_info"], aug["reward_model"], strict=True):
        mapping = mappings[info_row["conversation_id"]]
        old_id = info_row["conversation_id"].rsplit("-aug", 1)[0]
        gold = list(reward["ground_truth"]["gold_doc_ids"])
        old_gold = []
        inverse = {v: k for k, v in mapping.items()}
        for doc in gold:
            name, _, attribute = doc.partition("::")
            assert name in inverse, doc  # every gold entity was swapped
            old_gold.append(f"{inverse[name]}::{attribute}")
        original = source[(old_id, info_row["turn_index"], tuple(old_gold))]
        text = " ".join(m["content"] for m in info_row["contexts"])
        target = json.loads(info_row["sft_target"])["rewritten_query"]
        for old in mapping:
            assert old not in text, (old, text)
            assert old not in target, (old, target)
        replaced += any(new in target for new in mapping.values())
        assert len(info_row["contexts"]) == len(original["contexts"])
    # the reference rewriter's targets on the swapped history name the new entities
    assert replaced > len(aug) // 4


# --- SFT-only rows from KdConv's other domains (--extra-sft) --------------------------------------

KDCONV_ROOT = KDCONV.parent


def test_parse_domains_refuses_unknown_ones() -> None:
    assert prep.parse_domains("film, music,film") == ("film", "music")
    assert prep.parse_domains("MUSIC") == ("music",)
    assert prep.parse_domains("") == ()
    # travel is the benchmark's own domain: never extra SFT rows
    with pytest.raises(ValueError, match=r"unknown KdConv domain 'travel', 'films'.*choose from film, music"):
        prep.parse_domains("travel,film,films")


def test_extra_sft_sources_name_every_missing_folder_at_once(tmp_path: Path) -> None:
    (tmp_path / "film").mkdir()
    for name in ("dev.json", "test.json"):
        (tmp_path / "film" / name).write_text("[]", encoding="utf-8")
    assert prep.extra_sft_sources(tmp_path, ["film"]) == [
        ("film", tmp_path / "film" / "dev.json"),
        ("film", tmp_path / "film" / "test.json"),
    ]
    assert prep.extra_sft_sources(tmp_path, []) == []
    (tmp_path / "film" / "test.json").unlink()
    with pytest.raises(FileNotFoundError) as err:
        prep.extra_sft_sources(tmp_path, ["film", "music"])
    message = str(err.value)
    assert f"not found at {tmp_path / 'film' / 'test.json'}, {tmp_path / 'music'}: " in message
    assert "github.com/thu-coai/KdConv" in message  # where the data comes from
    assert message.count(str(tmp_path / "music")) == 1  # the folder, not each of its files
    with pytest.raises(ValueError, match="unknown KdConv domain 'travel'"):
        prep.extra_sft_sources(tmp_path, ["travel"])


def test_attr_entity_names_add_the_names_without_their_disambiguation() -> None:
    dialogues = [
        {
            "messages": [
                {"message": "知道恋恋笔记本吗？"},
                {
                    "message": "知道，主演是瑞恩·高斯林。",
                    "attrs": [
                        {"name": "恋恋笔记本（美国2004年尼克·卡索维茨导演爱情片）", "attrname": "主演"},
                        {"name": "瑞恩·高斯林", "attrname": "Information"},
                    ],
                },
            ]
        },
        {"messages": [{"message": "听过吗？", "attrs": [{"name": "？（陈奕迅2011年发行专辑）"}, {"name": "21"}]}]},
        {"messages": [{"message": "你好"}]},
    ]
    assert prep.attr_entity_names(dialogues) == {
        "恋恋笔记本（美国2004年尼克·卡索维茨导演爱情片）",
        "恋恋笔记本",
        "瑞恩·高斯林",
        "？（陈奕迅2011年发行专辑）",  # a name with letters; its short form ？ names nothing
    }


def _kdconv_root_slice(tmp_path: Path, travel: int = 10, other: int = 3) -> Path:
    """A KdConv root in `tmp_path`: travel's first `travel` dialogues and knowledge base, and the first
    `other` dialogues of film's and music's dev.json and test.json."""
    root = tmp_path / "kdconv"
    _travel_slice(root / "travel", travel)
    for domain in ("film", "music"):
        (root / domain).mkdir()
        for name in ("dev.json", "test.json"):
            part = json.loads((KDCONV_ROOT / domain / name).read_text(encoding="utf-8-sig"))[:other]
            (root / domain / name).write_text(json.dumps(part, ensure_ascii=False), encoding="utf-8")
    return root


@needs_kdconv("travel/dev.json", *(f"{d}/{f}" for d in ("film", "music") for f in ("dev.json", "test.json")))
def test_prepare_writes_extra_sft_rows_from_both_files_of_each_domain(tmp_path: Path) -> None:
    root = _kdconv_root_slice(tmp_path)
    plain = prep.prepare(root / "travel", tmp_path / "plain", None, seed=0, history_chars=120)
    assert "extra" not in plain["files"]
    assert plain["extra_sft"] == {"domains": []}
    info = prep.prepare(root / "travel", tmp_path / "extra", None, seed=0, history_chars=120, extra_sft="film,music")
    # the travel splits are those of the run without extra rows
    assert info["rows"] == plain["rows"]
    for name in ("train", "val", "test"):
        pd.testing.assert_frame_equal(pd.read_parquet(info["files"][name]), pd.read_parquet(plain["files"][name]))
    extra = pd.read_parquet(info["files"]["extra"])
    section = info["extra_sft"]
    assert section["domains"] == ["film", "music"]
    assert section["file"] == info["files"]["extra"] == str(tmp_path / "extra" / "extra.parquet")
    assert section["rows"] == len(extra) > 0
    # rows from both files of each domain, counted per file; ids never those of travel
    ids = extra["extra_info"].map(lambda e: e["conversation_id"])
    source = ids.map(lambda i: "{}/{}.json".format(*i.split("-")[:2]))
    assert set(section["sources"]) == {"film/dev.json", "film/test.json", "music/dev.json", "music/test.json"}
    assert source.value_counts().to_dict() == {k: v["rows"] for k, v in section["sources"].items()}
    assert all(v["conversations"] == 3 and v["entities"] > 0 for v in section["sources"].values())
    travel_ids = set(pd.read_parquet(info["files"]["train"])["extra_info"].map(lambda e: e["conversation_id"]))
    assert not (set(ids) & travel_ids)
    # only turns with gold; each domain's own prompt line
    assert all(len(r["ground_truth"]["gold_doc_ids"]) > 0 for r in extra["reward_model"])
    domains = {s.split("/")[0]: set() for s in source}
    for src, e, prompt in zip(source, extra["extra_info"], extra["prompt"], strict=True):
        domains[src.split("/")[0]].add(e["domain"])
        assert e["domain"] in prompt[0]["content"]
        assert e["prompt_messages"] <= len(e["contexts"])
    assert domains == {"film": {"电影知识问答"}, "music": {"音乐知识问答"}}

    # the reference rewriter knows the file's attrs names: targets carry a name of the conversation's
    # attrs (a short form without the disambiguation) from the history into a turn that lacks it
    dialogues = {
        f"{d}-{f}-{i:04d}": conv
        for d in ("film", "music")
        for f in ("dev", "test")
        for i, conv in enumerate(json.loads((root / d / f"{f}.json").read_text(encoding="utf-8")))
    }
    carried: dict[str, int] = {"film": 0, "music": 0}
    for conv_id, e in zip(ids, extra["extra_info"], strict=True):
        names = prep.attr_entity_names([dialogues[conv_id]])
        query = json.loads(e["sft_target"])["rewritten_query"]
        turn = e["contexts"][-1]["content"]
        carried[conv_id.split("-")[0]] += any(n in query and n not in turn for n in names)
    assert carried["film"] > 0
    assert carried["music"] > 0
    assert all(v["target_names_entity"] > 0.3 for v in section["sources"].values())

    with pytest.raises(ValueError, match="unknown KdConv domain 'travel'"):
        prep.prepare(root / "travel", tmp_path / "bad", None, seed=0, history_chars=120, extra_sft=["travel"])
    (root / "music" / "test.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"not found at .*music/test\.json"):
        prep.prepare(root / "travel", tmp_path / "bad", None, seed=0, history_chars=120, extra_sft=["music"])
    assert not (tmp_path / "bad").exists()  # refused before anything is written
