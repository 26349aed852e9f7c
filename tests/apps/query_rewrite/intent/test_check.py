"""The offline intent check (queryrl.apps.query_rewrite.intent.check) on hand-written Chinese conversations.

Each case is (history, last user turn, rewrite, the expected code). The history alternates, ending with the
assistant's reply before the last turn. The real cases from GRPO runs (issue 25) are marked.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from queryrl.apps.query_rewrite.demo.data import make_catalogue, sales_demo_rows
from queryrl.apps.query_rewrite.demo.phrases import ASK, ASPECT_WORDS, ELLIPSIS
from queryrl.apps.query_rewrite.intent.check import CODES, NO_QUERY, check_intent, garbled, normalise, read_text
from queryrl.apps.query_rewrite.intent.slips import HOMOPHONES
from queryrl.apps.query_rewrite.metrics import no_retrieval_turn


def _contexts(history: list[str], last: str) -> list[dict[str, str]]:
    texts = [*history, last]
    roles = ["user" if (len(texts) - 1 - i) % 2 == 0 else "assistant" for i in range(len(texts))]
    return [{"role": r, "content": t} for r, t in zip(roles, texts, strict=True)]


PRO2 = ["你好，云帆 Pro2 平板电脑续航能撑一天吗?", "电池容量 9400 毫安，支持 67 瓦快充"]
GUGONG = ["故宫博物院好玩吗？", "很好玩，是中国最大的古代文化艺术博物馆。"]
X3 = ["星辰X3手机多少钱", "价格是 5298，颜色不影响价格"]
AIR6 = ["极光 Air6 无线耳机现货还有吗。", "这款黑色大概下周到，白色暂时没货"]

KEPT_CASES: list[tuple[list[str], str, str]] = [
    ([], "你好，朗月Max8平板电脑保修政策是什么？", "你好，朗月Max8平板电脑保修政策是什么？"),
    ([], "你好，朗月Max8平板电脑保修政策是什么？", "朗月Max8 保修"),  # generic words (政策) and the kind may go
    ([], "你好，朗月Max8平板电脑保修政策是什么？", "朗月 Max8 平板电脑 质保"),  # 质保: the same question type
    (PRO2, "这个多少钱?", "云帆 Pro2 价格"),  # 这个 resolved from the history
    (PRO2, "还有，这个配置怎么样?", "还有，这个配置怎么样? pro2"),  # the reference's answer
    (PRO2, "那这个性能如何？？", "云帆 Pro2 是什么配置"),  # 性能 / 配置: both specs
    (AIR6, "极光Pro7的话呢?", "极光 Pro7 现货"),  # ellipsis: the type comes from the history
    (AIR6, "极光Pro7的话呢?", "极光 Pro7 库存还有吗"),
    (X3, "那保修呢", "星辰X3 保修"),
    (X3, "这个便宜100卖不卖", "星辰X3 便宜100卖不卖"),
    (X3, "说实话有点贵，底价多少呀？", "星辰X3 优惠活动"),  # 贵 / 底价: price or promotion
    (X3, "我预算3000左右，这个能以旧换新吗", "星辰X3 以旧换新"),  # the remark before the question may go
    (X3, "主要给孩子上网课用，这个屏幕多大", "星辰X3 屏幕尺寸"),
    (X3, "它续航能撑一天吗", "星辰X3 续航"),  # a quantity (一天) is a detail
    (X3, "它售后怎么样", "星辰X3 退货政策"),  # 售后: warranty or return
    ([], "星晨x3续行怎么样", "星辰 X3 续航"),  # the customer's slips (星晨, 续行) read as meant
    ([], "云凡Pro2平板电脑最近有优惠吗？？", "云帆 Pro2 优惠"),  # a one-character slip of an unknown name
    (X3, "说说扣", "星辰X3 折扣"),  # a lost character: 扣 may be 折扣
    (X3, "颜呢呀？", "星辰X3 颜色"),
    (GUGONG, "哦，那电话是多少知道吗？", "故宫博物院电话"),
    (GUGONG, "那门票多少钱", "故宫博物院 门票"),  # a ticket's question is its price
    (GUGONG, "那里多少钱", "故宫博物院门票多少钱"),
    (GUGONG, "那里几点开门", "故宫博物院开放时间"),
    (GUGONG, "它在哪里", "故宫博物院 地址"),
    (GUGONG, "那周边有什么好玩的", "故宫博物院 周边 好玩的景点"),
    (["北京大学在哪", "在海淀区颐和园路 5 号"], "那里有什么好吃的", "北京大学 附近 好吃的"),
    (X3, "它的电话是多少", "星辰X3 客服电话是多少"),  # 是多少 asks: not an answer
    (X3, "价格是5298吗", "星辰X3 价格是5298吗"),  # a number from the conversation is no invention
    (X3, "好的，谢谢", ""),  # small talk: nothing to ask
    (X3, "好的，我看看", "星辰X3 好的，我看看"),  # a name carried into a turn that asks nothing asks nothing
    ([], "在吗", "在吗"),
    ([], "顺便看看笔记本，Pro8能以旧换新吗", "朗月 Pro8 笔记本电脑 以旧换新"),  # 笔记本 and 笔记本电脑: one kind
    (["朗月Max8平板多少钱", "1998 元"], "那金色的呢", "朗月Max8 金色 价格"),
    ([], "ＭＡＸ８平板电脑保修多久？", "max8 保修"),  # full-width letters and digits
]

CHANGED_CASES: list[tuple[list[str], str, str, str]] = [
    # issue 25, from the demo's GRPO: the question swapped for another
    ([], "你好，朗月Max8平板电脑保修政策是什么？", "你好，朗月Max8平板电脑能七天无理由退吗？", "question_changed"),
    (PRO2, "这个多少钱?", "这个能马上发货吗? pro2", "question_changed"),
    # issue 25, a pretrained model's "rewrites" that answer with invented facts
    (GUGONG, "哦，那电话是多少知道吗？", "电话是1234567890", "answered"),
    (GUGONG, "哦，那电话是多少知道吗？", "010-66162868，地址是北京的海野鸭岛", "answered"),
    (GUGONG, "哦，那电话是多少知道吗？", "故宫博物院电话 1234567890", "invented"),
    (X3, "这个便宜100卖不卖", "星辰X3 价格是 5298", "answered"),  # in the history, still an answer
    (GUGONG, "它在哪里", "故宫博物院位于北京市中心", "answered"),
    (GUGONG, "几点开门", "故宫开放时间为8:30", "answered"),
    (X3, "那保修呢", "星辰X3 保修 2 年", "invented"),
    (X3, "那保修呢", "星辰X7 保修", "invented"),  # a model the conversation never named
    (X3, "它续航怎么样", "星辰X3 续航怎么样 价格", "question_added"),  # an earlier question added
    (X3, "那保修呢", "星辰X3 保修 价格", "question_added"),
    (X3, "它有几个颜色", "星辰X3 价格", "question_changed"),
    (X3, "它有几个颜色", "星辰X3", "question_dropped"),
    (X3, "它保修多久，多少钱", "星辰X3 保修", "question_dropped"),  # one of two questions lost
    (AIR6, "极光Pro7的话呢?", "极光 Pro7 价格", "question_added"),  # a type from nowhere
    (GUGONG, "哦，那电话是多少知道吗？", "故宫博物院地址", "question_changed"),
    (GUGONG, "那里几点开门", "故宫博物院门票多少钱", "question_changed"),
    (X3, "在吗", "星辰X3 价格", "question_added"),  # small talk made a question
    (X3, "谢谢，我再想想", "星辰X3 保修多久", "question_added"),
    ([], "故宫在哪里", "天坛在哪里", "words_dropped"),  # another place
    ([], "王府井小吃街有什么好吃的", "南锣鼓巷有什么好吃的", "words_dropped"),
    ([], "十三陵几点开门", "八达岭几点开门", "words_dropped"),  # names that start like a quantity
    ([], "星辰X3手机多少钱", "星辰X3耳机多少钱", "words_dropped"),  # another kind of product
    ([], "你好，朗月Max8平板电脑保修政策是什么？", "朗月 保修政策", "words_dropped"),  # the model lost
    (X3, "它多少钱", "", "empty"),
    (X3, "它有几个颜色", "你好", "question_dropped"),
]

GARBLED = [
    "极光 Neo9 无线\ufffd发我看看?",  # issue 25: scored like the clean reference
    "星辰X3\ud800多少钱",  # a lone surrogate
    "星辰X3多少钱\x07",  # a control character
    "星辰X3\x1b[0m多少钱",
    "ä½ å¥½ï¼Œæ˜Ÿè¾°X3",  # UTF-8 read as Latin-1
    "星辰X3多少钱\\xe4\\xbd",  # bytes written out
    "星辰\\u4f60X3",
    "星辰X3\uffff多少钱",
]


@pytest.mark.parametrize(("history", "last", "rewrite"), KEPT_CASES)
def test_rewrites_that_keep_the_question(history: list[str], last: str, rewrite: str) -> None:
    verdict = check_intent(_contexts(history, last), rewrite)
    assert verdict.kept, verdict.reason
    assert verdict.code == "kept"


@pytest.mark.parametrize(("history", "last", "rewrite", "code"), CHANGED_CASES)
def test_rewrites_that_change_the_question(history: list[str], last: str, rewrite: str, code: str) -> None:
    verdict = check_intent(_contexts(history, last), rewrite)
    assert not verdict.kept
    assert verdict.code == code, verdict.reason
    assert verdict.reason


@pytest.mark.parametrize("rewrite", GARBLED)
def test_garbled_text_is_never_kept(rewrite: str) -> None:
    verdict = check_intent(_contexts([], rewrite.replace("\ufffd", "耳机")), rewrite)
    assert (verdict.kept, verdict.code) == (False, "garbled")
    assert garbled(rewrite) is not None
    # the same text, whatever the turn (even a copy of a garbled turn)
    assert check_intent(_contexts([], rewrite), rewrite).code == "garbled"


def test_reasons_name_what_changed() -> None:
    swapped = check_intent(_contexts([], "朗月Max8平板电脑保修政策是什么？"), "朗月Max8平板电脑能七天无理由退吗？")
    assert swapped.reason == "asks return instead of warranty"
    phone = check_intent(_contexts(GUGONG, "哦，那电话是多少知道吗？"), "电话是1234567890")
    assert "电话是1234567890" in phone.reason
    assert "1234567890 occur(s) nowhere" in phone.reason
    lost = check_intent(_contexts([], "你好，朗月Max8平板电脑保修政策是什么？"), "朗月 保修")
    assert "max8" in lost.reason
    assert check_intent(_contexts([], "\u5728\u5417"), "\ufffd").reason == "garbled: replacement character U+FFFD"
    assert set(CODES) >= {swapped.code, phone.code, lost.code}


def test_summary_and_profile_count_as_the_conversation() -> None:
    """A returning customer's product is named in the CRM summary only: carrying it over is no invention."""
    contexts = _contexts([], "还是我，上次那款有没有赠品?")
    rewrite = "还是我，上次那款有没有赠品? air1"
    assert check_intent(contexts, rewrite).code == "invented"
    assert check_intent(contexts, rewrite, sources=["上次问过极光 Air1 智能手表的配置。"]).kept


def test_small_talk_label_decides_an_empty_rewrite() -> None:
    contexts = _contexts([], "你们周末也上班吗")  # the demo labels it small talk; the text alone asks
    assert check_intent(contexts, "").code == "empty"
    assert check_intent(contexts, "", small_talk=True).kept
    assert check_intent(contexts, "星辰X3 价格", small_talk=True).code == "invented"


def test_no_query_and_bad_input() -> None:
    assert check_intent(_contexts([], "它多少钱"), None) == NO_QUERY
    assert not NO_QUERY.kept
    assert NO_QUERY.as_dict() == {"kept": False, "code": "no_query", "reason": NO_QUERY.reason}
    with pytest.raises(ValueError, match="no user turn"):
        check_intent([{"role": "assistant", "content": "您好"}], "价格")
    with pytest.raises(ValueError, match=r"contexts\[0\]"):
        check_intent([{"role": "assistant", "content": None}, {"role": "user", "content": "多少钱"}], "价格")
    with pytest.raises(ValueError, match="rewrite must be a string"):
        check_intent(_contexts([], "它多少钱"), 42)  # type: ignore[arg-type]


def test_normalise() -> None:
    assert normalise("  ＭＡＸ８   平板  ") == "max8 平板"
    assert normalise("星晨续行包修") == "星辰续航保修"  # the demo's slips


# demo aspect -> the question types its words and questions must fall in
DEMO_TYPES = {
    "price": {"price"},
    "specs": {"specs"},
    "battery": {"battery"},
    "colors": {"colors"},
    "promotion": {"promotion"},
    "warranty": {"warranty", "return"},  # the demo asks 能七天无理由退吗 under warranty
    "delivery": {"shipping"},
    "stock": {"stock"},
}


def test_every_demo_question_has_its_question_type() -> None:
    for aspect, phrasings in ASK.items():
        expected = DEMO_TYPES[aspect]
        for phrasing in phrasings:
            types = read_text(phrasing.format(p="星辰 X3")).types
            assert types & expected, (aspect, phrasing, types)
        for word in ASPECT_WORDS[aspect]:
            for ellipsis in ELLIPSIS:
                assert read_text(ellipsis.format(a=word)).types & expected, (aspect, ellipsis, word)
    for word, slips in HOMOPHONES.items():
        for slip in slips:
            assert read_text(slip).types == read_text(word).types, (word, slip)


def _rows() -> list[dict[str, Any]]:
    return sales_demo_rows("test")


def test_the_demo_reference_and_gold_titles_keep_the_intent() -> None:
    """The reference's answers copy the turn: all kept. A gold title ("星辰 X3 手机 价格") is the canonical
    rewrite: kept except where the demo files a return question (七天无理由退) under warranty."""
    titles = {d["doc_id"]: d["title"] for d in make_catalogue()}
    reference_kept, title_verdicts = 0, []
    rows = _rows()
    for row in rows:
        info, gold = row["extra_info"], row["reward_model"]["ground_truth"]["gold_doc_ids"]
        sources = [info["history_summary"], info["user_profile"]]
        small = no_retrieval_turn(gold, info["turn_type"])
        target = json.loads(info["sft_target"])["rewritten_query"]
        reference_kept += check_intent(info["contexts"], target, sources, small_talk=small).kept
        if gold:
            title = " ".join(titles[g] for g in gold)
            title_verdicts.append(check_intent(info["contexts"], title, sources, small_talk=small))
    assert reference_kept == len(rows)
    kept = sum(v.kept for v in title_verdicts)
    assert kept >= 0.97 * len(title_verdicts), [v.reason for v in title_verdicts if not v.kept]
    assert {v.code for v in title_verdicts if not v.kept} <= {"question_changed", "words_dropped"}


@pytest.mark.parametrize("marker", ["1. ", "2、", "(3) ", "①"])
def test_a_list_number_before_the_query_is_no_invented_number(marker: str) -> None:
    contexts = _contexts(["星辰X3 多少钱？", "2999 元。"], "那保修呢")
    assert check_intent(contexts, f"{marker}星辰X3 保修").kept
    # a number that follows the list number is still read: a decimal or a time is no list number
    assert check_intent(contexts, f"{marker}星辰X3 保修 5 年").code == "invented"
    assert check_intent(contexts, "1.5 年 星辰X3 保修").code == "invented"


TSINGHUA = ["清华大学开放参观吗？", "开放，需要预约。"]


@pytest.mark.parametrize(
    ("rewrite", "code"),
    [
        ("清华大学 对了，它里面游玩时间要用多久？", "kept"),  # the reference's shape: a name from the history
        ("对了，它里面游玩时间要用多久？ 清华大学", "kept"),
        ("清华大学 游玩需要多长时间", "kept"),  # a paraphrase inside the question is no invention
        ("清华大学游玩时间", "kept"),  # keywords, no question word
        ("对了，它里面游玩时间要用多久？ 红烧肉", "invented"),  # Gemma's warm-up: the prompt's example dish
        ("对了，它里面游玩时间要用多久？ 赶快赶快赶快赶快赶快赶快", "garbled"),  # a decoding loop
    ],
)
def test_words_beside_the_question_loops_and_unrelated_text(rewrite: str, code: str) -> None:
    assert check_intent(_contexts(TSINGHUA, "对了，它里面游玩时间要用多久？"), rewrite).code == code


def test_a_rewrite_that_asks_nothing_and_shares_no_word_drops_the_question() -> None:
    contexts = _contexts(TSINGHUA, "能玩多久呢？")  # no content word, no known question type
    assert check_intent(contexts, "1. 答复：").code == "question_dropped"
    assert check_intent(contexts, "清华大学 游玩时长").kept  # a name of the conversation


def test_a_loop_the_customer_wrote_is_no_garble() -> None:
    contexts = _contexts(TSINGHUA, "哈哈哈哈，那门票多少钱？")
    assert check_intent(contexts, "哈哈哈哈，清华大学门票多少钱？").kept
    assert check_intent(contexts, "清华大学门票多少钱？ 钱钱钱钱").code == "garbled"


FIRE = ["中国消防博物馆的电话是多少啊？", "我也不清楚，你知道吗？"]


@pytest.mark.parametrize(
    ("last", "rewrite", "code"),
    [
        # the turn tells one value and asks another (KdConv's speakers answer, then ask): the told clause may go
        ("电话是010-68411475，你知道这里的开放时间吗？", "你知道这里的开放时间吗？ 中国消防博物馆", "kept"),
        ("电话是010-68411475，你知道这里的开放时间吗？", "中国消防博物馆，电话是010-68411475，开放时间呢？", "kept"),
        ("门票为20元，地址在哪里？", "中国消防博物馆 地址在哪里", "kept"),
        # an address told with 在 (KdConv's "地址在北京市…，电话你知道吗？") is told as with 是
        ("地址在北京市西城区，电话你知道吗？", "中国消防博物馆 电话", "kept"),
        ("地址在北京市西城区，电话你知道吗？", "中国消防博物馆 电话 午门在哪里？", "question_added"),
        ("电话你知道吗？", "中国消防博物馆 电话，地址在北京市西城区", "answered"),
        # what the turn asks still has to be asked, and a told value is not a question
        ("电话是010-68411475，你知道这里的开放时间吗？", "中国消防博物馆 电话是多少", "question_changed"),
        ("电话是010-68411475，你知道这里的开放时间吗？", "电话是010-68411475", "question_changed"),
        # a clause with a question marker asks, whatever its link: both questions stay
        ("门票是20元吗？开放时间呢？", "中国消防博物馆 开放时间", "question_dropped"),
        # a turn that only tells keeps its reading (no other clause asks)
        ("电话是010-68411475", "中国消防博物馆 电话是010-68411475", "kept"),
    ],
)
def test_a_clause_that_tells_a_value_beside_a_question_is_not_asked(last: str, rewrite: str, code: str) -> None:
    verdict = check_intent(_contexts(FIRE, last), rewrite)
    assert verdict.code == code, verdict.reason
    assert read_text("电话是010-68411475，你知道这里的开放时间吗？").types == {"hours"}
    assert read_text("电话是多少，开放时间呢？").types == {"phone", "hours"}
    assert read_text("地址在北京市西城区，开放时间呢？").types == {"hours"}
    assert read_text("地址在哪里，开放时间呢？").types == {"address", "hours"}


YUANMINGYUAN = ["圆明园的门票多少钱？", "10元，学生半价。"]


@pytest.mark.parametrize(
    ("last", "rewrite", "code"),
    [
        # KdConv travel's visiting time and nearby sights, asked in the speaker's words and rewritten with
        # the knowledge base's field names: the same question, no invented words
        ("这里能玩多久呀？", "圆明园 建议游玩时间", "kept"),
        ("这个景点可以玩几个小时呢？", "圆明园 游玩时间", "kept"),
        ("它的周边还有什么景点啊？", "圆明园 周边景点", "kept"),
        ("它附近有啥值得推荐的景点吗？", "圆明园 周边景点", "kept"),
        ("可以帮我查一下它在什么地方吗？", "圆明园 地址", "kept"),
        # and what the check now sees that it could not
        ("这里能玩多久呀？", "圆明园 开放时间", "question_changed"),
        ("这里能玩多久呀？", "圆明园", "question_dropped"),
        ("这里能玩多久呀？", "圆明园 建议游玩时间 周边景点", "question_added"),
        ("它的周边还有什么景点啊？", "圆明园 游玩时间是2小时", "answered"),
    ],
)
def test_visiting_time_and_nearby_sights_are_question_types(last: str, rewrite: str, code: str) -> None:
    verdict = check_intent(_contexts(YUANMINGYUAN, last), rewrite)
    assert verdict.code == code, verdict.reason
