"""The sales demo's dialogues: a customer chatting with a sales assistant about the catalogue.

A dialogue is a short random walk over turn kinds, each user turn labelled with its gold documents:

- ``explicit``: names the product ("星辰 X3 手机多少钱？", or a short form "星辰X3");
- ``pronoun``: "这款续航怎么样？" -> the product in focus;
- ``ellipsis``: "那保修呢？" (same product, another aspect); after a stock question "那黑色的呢？";
- ``typo``: one of the above with a slip: a homophone ("续行" for 续航, "星晨" for 星辰) or a missing
  character;
- ``bargain``: "能便宜点吗？" -> the focus product's promotion (and its price for "最低多少？");
- ``switch``: another model of the same line ("那云帆 Pro2 呢？" keeps the aspect);
- ``line_switch``: a product of another line ("顺便看看平板，…");
- ``comparison``: "这两款哪个续航更好？" -> that aspect's documents of the last two products;
- ``followup``: a returning customer's "上次问的那款有货了吗？", resolvable only from the CRM summary;
- ``chitchat``: greetings, "哈哈", "谢谢", "好的我再想想", small talk: NO retrieval (empty gold).

Every user turn carries the CRM view at the time it arrives: ``user_profile`` (who the customer is,
budget, preferences; it grows when the customer tells something about themself) and
``history_summary`` (the earlier turns summarised, updated after every turn; a returning customer
starts with the previous session's). The assistant's replies paraphrase the catalogue facts (other
words, other number formats) and refer to the product by a short form, "这款", or not at all: they
never repeat a document or the product's full name.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from queryrl.apps.query_rewrite.data.conversations import Conversation, Message
from queryrl.apps.query_rewrite.demo import phrases as ph
from queryrl.apps.query_rewrite.intent.slips import BRAND_HOMOPHONES, HOMOPHONES

ASPECT_LABELS = {
    "price": "价格",
    "specs": "配置",
    "battery": "续航",
    "colors": "颜色",
    "promotion": "优惠",
    "warranty": "保修",
    "delivery": "配送",
    "stock": "库存",
}
NO_RETRIEVAL_KIND = "chitchat"
PROFILE_SEEDS = ("", "", "学生", "上班族", "宝妈", "商务人士", "数码爱好者", "退休教师")
LINE_NAMES = {"phone": "手机", "laptop": "笔记本", "earphone": "耳机", "watch": "手表", "tablet": "平板"}


@dataclass
class Product:
    """A catalogue model: its id, names and aspect documents (with their ``facts``)."""

    pid: str
    name: str  # the full name as in the documents, "星辰 X3 手机"
    brand: str
    model: str
    line: str
    docs: dict[str, dict[str, Any]]

    def short(self, rng: random.Random) -> str:
        """How a person writes the product without its full name: "X3", "星辰 X3", "星辰X3"."""
        return rng.choice((self.model, f"{self.brand} {self.model}", f"{self.brand}{self.model}"))


def products_of(catalogue: list[dict[str, Any]]) -> dict[str, Product]:
    """The catalogue's documents grouped into products."""
    out: dict[str, Product] = {}
    for doc in catalogue:
        pid, _, aspect = doc["doc_id"].rpartition("-")
        if pid not in out:
            brand, model = doc["product"].split(" ")[:2]
            out[pid] = Product(pid, doc["product"], brand, model, doc["category"], {})
        out[pid].docs[aspect] = doc
    return out


@dataclass
class _Turn:
    text: str
    gold: list[str]
    kind: str
    reply: str


@dataclass
class _State:
    """One dialogue in progress: what is in focus and what the CRM knows."""

    rng: random.Random
    products: dict[str, Product]
    focus: Product | None = None
    aspect: str = "price"
    seen: list[Product] = field(default_factory=list)
    profile: list[str] = field(default_factory=list)
    asked: dict[str, list[str]] = field(default_factory=dict)  # product name -> aspect labels, in order
    notes: list[str] = field(default_factory=list)
    previous: str = ""  # the previous session's summary (returning customers)

    def see(self, product: Product, aspect: str) -> None:
        self.focus, self.aspect = product, aspect
        if product not in self.seen:
            self.seen.append(product)
        labels = self.asked.setdefault(product.name, [])
        if ASPECT_LABELS[aspect] not in labels:
            labels.append(ASPECT_LABELS[aspect])

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def learn(self, item: str) -> None:
        if item and item not in self.profile:
            self.profile.append(item)

    def summary(self) -> str:
        """The CRM summary of the turns so far: products and aspects asked about (the last two
        products, their last three aspects), then what else happened."""
        parts = [self.previous] if self.previous else []
        asked = list(self.asked.items())[-2:]
        if asked:
            parts.append("咨询" + "、".join(f"{n}（{'、'.join(a[-3:])}）" for n, a in asked))
        parts += self.notes[-2:]
        return "；".join(parts) + ("。" if parts else "")


# --- user turns ----------------------------------------------------------------------------------


def _particle(rng: random.Random, core: str) -> str:
    if core.endswith("吗"):
        return rng.choice(("？", "?", "", "。", "？？"))
    return rng.choice(ph.PARTICLES)


def _question(s: _State, ref: str, aspect: str, opener: bool = True) -> str:
    """A question about `aspect` of the product written as `ref`, sometimes with an opener or a remark."""
    rng = s.rng
    core = rng.choice(ph.ASK[aspect]).format(p=ref)
    head = rng.choice(ph.OPENERS) if opener else ""
    if rng.random() < 0.15:
        remark, item = rng.choice(ph.REMARKS)
        head += remark
        s.learn(item)
    elif rng.random() < 0.08 and s.focus is not None:
        budget = _budget(s.focus, rng)
        head += rng.choice(ph.BUDGET_REMARKS).format(b=budget)
        s.learn(f"预算约 {budget}")
    return head + core + _particle(rng, core)


def _budget(product: Product, rng: random.Random) -> str:
    price = int(product.docs["price"]["facts"]["price"])
    step = 1000 if price > 3000 else 100
    return f"{(price // step + rng.choice((0, 1))) * step} 元"


def _explicit(s: _State, product: Product, aspect: str) -> _Turn:
    rng = s.rng
    ref = rng.choice((product.name, product.name, product.name.replace(" ", ""), product.short(rng)))
    if s.seen:
        text = _question(s, ref, aspect)
    else:  # the first question: no "另外，…" before anything was asked
        text = rng.choice(("", "", "请问", "你好，", "我想问下，")) + _question(s, ref, aspect, opener=False)
    s.see(product, aspect)
    return _Turn(text, [f"{product.pid}-{aspect}"], "explicit", _reply(s, product, aspect))


def _pronoun(s: _State, product: Product) -> _Turn:
    rng = s.rng
    aspect = rng.choice(sorted(set(ph.ASK) - {s.aspect}))
    ref = rng.choice(ph.PRONOUNS).format(m=ph.MEASURE[product.line])
    s.see(product, aspect)
    return _Turn(_question(s, ref, aspect), [f"{product.pid}-{aspect}"], "pronoun", _reply(s, product, aspect))


def _ellipsis(s: _State, product: Product) -> _Turn:
    rng = s.rng
    if s.aspect == "stock" and rng.random() < 0.6:
        facts = product.docs["stock"]["facts"]
        i = rng.randrange(len(facts["colours"]))
        colour, state = facts["colours"][i], ph.STOCK_STATES[facts["states"][i]]
        text = rng.choice(ph.STOCK_COLOUR).format(c=colour) + rng.choice(("？", "?", ""))
        reply = rng.choice(("{c}{s}", "{c}的话{s}", "查了下，{c}{s}")).format(c=colour, s=state)
        return _Turn(text, [f"{product.pid}-stock"], "ellipsis", reply)
    aspect = rng.choice(sorted(set(ph.ASK) - {s.aspect}))
    text = rng.choice(ph.ELLIPSIS).format(a=rng.choice(ph.ASPECT_WORDS[aspect]))
    s.see(product, aspect)
    return _Turn(text + _particle(rng, text), [f"{product.pid}-{aspect}"], "ellipsis", _reply(s, product, aspect))


def _typo(s: _State, product: Product) -> _Turn:
    """A pronoun, ellipsis or explicit question with one slip in it (same gold)."""
    rng = s.rng
    base = rng.choice((_pronoun, _ellipsis, _explicit_focus))(s, product)
    return _Turn(_slip(base.text, product, rng), base.gold, "typo", base.reply)


def _explicit_focus(s: _State, product: Product) -> _Turn:
    return _explicit(s, product, s.rng.choice(sorted(set(ph.ASK) - {s.aspect})))


def _slip(text: str, product: Product, rng: random.Random) -> str:
    """`text` with one homophone swapped in, or the brand misspelt, or one Chinese character left out."""
    words = [w for w in HOMOPHONES if w in text]
    if words and rng.random() < 0.7:
        word = rng.choice(words)
        return text.replace(word, rng.choice(HOMOPHONES[word]), 1)
    if product.brand in text:
        return text.replace(product.brand, BRAND_HOMOPHONES[product.brand], 1)

    def cjk(ch: str) -> bool:
        return "\u4e00" <= ch <= "\u9fff"

    # a character inside a word of the question (both neighbours Chinese), never the pronoun
    inner = [i for i in range(1, len(text) - 1) if cjk(text[i - 1]) and cjk(text[i]) and cjk(text[i + 1])]
    inner = [i for i in inner if text[i] not in "它款个台副块那的"]
    if not inner:
        return text + text[-1]  # a doubled key
    i = rng.choice(inner)
    return text[:i] + text[i + 1 :]


def _bargain(s: _State, product: Product) -> _Turn:
    rng = s.rng
    n = rng.choice((50, 100, 200, 300))
    if rng.random() < 0.35:
        core, gold = rng.choice(ph.BARGAIN_PRICE).format(n=n), ["price", "promotion"]
    else:
        core, gold = rng.choice(ph.BARGAIN_PROMOTION).format(n=n), ["promotion"]
    text = rng.choice(ph.BARGAIN_OPENERS) + core + _particle(rng, core)
    promo = _promotion(product, rng)
    reply = rng.choice(ph.BARGAIN_REPLIES).format(promo=promo)
    if "price" in gold:
        reply = f"目前标价 {product.docs['price']['facts']['price']}，" + reply
    s.focus, s.aspect = product, "promotion"
    s.note("问过能否优惠")
    return _Turn(text, [f"{product.pid}-{a}" for a in gold], "bargain", reply)


def _switch(s: _State, product: Product, kind: str) -> _Turn:
    """A new product mid-dialogue: same line (``switch``) or another line (``line_switch``)."""
    rng = s.rng
    if kind == "switch" and rng.random() < 0.4:  # "那云帆 Pro2 呢？": the same aspect, another product
        aspect = s.aspect
        text = rng.choice(("那{p}呢", "{p}呢", "换成{p}呢", "{p}的话呢")).format(p=product.short(rng))
        text += rng.choice(("？", "?", ""))
    else:
        aspect = rng.choice(sorted(ph.ASK))
        ref = rng.choice((product.name, product.short(rng)))
        lead = (
            rng.choice(("另外，", "还有一款，", "我再看看别的，", "对比一下，"))
            if kind == "switch"
            else rng.choice(("顺便看看{l}，", "我还想买个{l}，", "对了，{l}这边", "再问下{l}，")).format(
                l=LINE_NAMES[product.line]
            )
        )
        text = lead + _question(s, ref, aspect, opener=False)
    s.see(product, aspect)
    return _Turn(text, [f"{product.pid}-{aspect}"], kind, _reply(s, product, aspect))


def _comparison(s: _State) -> _Turn:
    rng = s.rng
    a, b = s.seen[-2], s.seen[-1]
    aspect = rng.choice(sorted(ph.COMPARE))
    text = rng.choice(ph.COMPARE[aspect]).format(a=a.short(rng), b=b.short(rng))
    text += _particle(rng, text)
    reply = f"{a.model}：{_fact(a, aspect, rng)}；{b.model}：{_fact(b, aspect, rng)}"
    for p in (a, b):
        s.see(p, aspect)
    s.focus = None  # after "这两款…" a bare "它" would be ambiguous
    s.note(f"比较过{a.model}和{b.model}的{ASPECT_LABELS[aspect]}")
    return _Turn(text, [f"{a.pid}-{aspect}", f"{b.pid}-{aspect}"], "comparison", reply)


def _chitchat(s: _State, what: str) -> _Turn:
    rng = s.rng
    if what == "greeting":
        text = rng.choice(ph.GREETING_HEADS) + rng.choice(ph.GREETINGS) + rng.choice(ph.GREETING_TAILS)
    elif what == "filler":
        text = rng.choice(ph.FILLERS) + rng.choice(ph.FILLER_TAILS)
    elif what == "closing":
        text = rng.choice(ph.CLOSINGS) + rng.choice(ph.CLOSING_TAILS)
        s.note("表示再考虑" if "想" in text or "考虑" in text or "商量" in text else "结束咨询")
    else:
        text = rng.choice(ph.SMALL_TALK) + rng.choice(("", "？", "哈哈", "～", "。"))
    return _Turn(text, [], NO_RETRIEVAL_KIND, rng.choice(ph.CHITCHAT_REPLIES[what]))


def _followup(s: _State, product: Product) -> _Turn:
    """A returning customer's first question about the product of the previous session."""
    rng = s.rng
    aspect = rng.choice(("stock", "price", "promotion", "delivery", "colors"))
    ref = rng.choice(("上次问的那款", "上回看的那个", "之前咨询的那款", "我上次问的那个", "上次那款"))
    core = rng.choice(ph.ASK[aspect]).format(p=ref)
    s.see(product, aspect)
    text = rng.choice(("", "你好，", "还是我，")) + core + _particle(rng, core)
    return _Turn(text, [f"{product.pid}-{aspect}"], "followup", _reply(s, product, aspect))


# --- assistant replies: paraphrases of the facts -----------------------------------------------------


def _ref(product: Product, rng: random.Random) -> str:
    return rng.choice(("这款", "这款", "它", product.model + " ", product.short(rng) + " ", "", ""))


def _reply(s: _State, product: Product, aspect: str) -> str:
    rng = s.rng
    fact = _fact(product, aspect, rng)
    lead = _ref(product, rng)
    return lead + fact if aspect != "price" else fact.replace("{r}", lead)


def _promotion(product: Product, rng: random.Random) -> str:
    facts = product.docs["promotion"]["facts"]
    key = next(k for k in ph.REPLY_PROMOTION if facts["template"].startswith(k))
    return ph.REPLY_PROMOTION[key].format(n=facts["n"])


def _fact(product: Product, aspect: str, rng: random.Random) -> str:
    """One aspect's facts in the assistant's words (see :mod:`.phrases`); for ``price`` the text keeps
    a ``{r}`` slot for the product reference."""
    f = product.docs[aspect]["facts"]
    if aspect == "price":
        return rng.choice(ph.REPLY_PRICE).format(r="{r}", price=f["price"], tail=rng.choice(ph.PRICE_TAILS))
    if aspect == "specs":
        return rng.choice(("用的是", "配置是", "的参数：", "")) + _specs_reply(f)
    if aspect == "battery":
        unit, amount = f["unit"], f["amount"]
        return {
            "mAh": f"电池容量 {amount} 毫安，支持 {f['watts']} 瓦快充",
            "Wh": f"电池 {amount} 瓦时，正常办公能用十二个小时左右",
            "小时": f"单次能听 {amount} 个小时，算上充电盒还能更久",
            "天": f"正常用一次充电能撑 {amount} 天",
        }[unit]
    if aspect == "colors":
        names = "、".join(c.removesuffix("色") for c in f["colours"])
        return f"有{names}{ph.cn_count(len(f['colours']))}个配色可选"
    if aspect == "promotion":
        return _promotion(product, rng)
    if aspect == "warranty":
        return (
            f"官方保 {f['years']} 年，{ph.cn_count(f['days'])}天内不满意可以退"
            if f["days"] < 10
            else (f"官方保 {f['years']} 年，半个月内不满意可以退")
        )
    if aspect == "delivery":
        key = next(k for k in ph.REPLY_DELIVERY if f["text"].startswith(k))
        return ph.REPLY_DELIVERY[key]
    states = [f"{c}{ph.STOCK_STATES[st]}" for c, st in zip(f["colours"], f["states"], strict=True)]
    return "，".join(states)


def _specs_reply(f: dict[str, Any]) -> str:
    line = f["line"]
    if line == "phone":
        return f"屏幕 {f['screen']} 寸 OLED，运行内存 {f['ram']}G，存储 {f['storage']}G，主摄 {f['cam']} 万"
    if line == "laptop":
        return f"屏幕 {f['screen']} 寸、分辨率 2.5K，{f['ram']}G 运行内存，固态 {f['storage']}G"
    if line == "earphone":
        return f"降噪深度 {f['anc']} 分贝，蓝牙 5.{f['bt']}，一只才 {f['weight']} 克"
    if line == "watch":
        return f"防水 {f['atm']} 个大气压，表盘 {f['screen']} 寸 AMOLED，能测心率和血氧"
    return f"{f['ram']}G 运行内存，{f['screen']} 寸 LCD 显示屏，可以配手写笔"


# --- a dialogue ------------------------------------------------------------------------------------

# the next kind after a retrieval turn (weights); "comparison" needs two products seen
NEXT_KINDS = {
    "pronoun": 20,
    "ellipsis": 16,
    "typo": 9,
    "bargain": 8,
    "switch": 9,
    "line_switch": 5,
    "comparison": 16,
    "chitchat": 6,
}


def _next_kind(s: _State) -> str:
    kinds = dict(NEXT_KINDS)
    if len(s.seen) < 2:
        kinds.pop("comparison")
    if s.focus is None:  # after a comparison: name a product or chat
        kinds = {"switch": 5, "line_switch": 4, "chitchat": 4}
    names = sorted(kinds)
    return s.rng.choices(names, weights=[kinds[k] for k in names])[0]


def _other(s: _State, same_line: bool) -> Product:
    line = s.seen[-1].line
    pool = [p for pid, p in sorted(s.products.items()) if (p.line == line) == same_line and p not in s.seen]
    return s.rng.choice(pool)


_Made = tuple[_Turn, str, str]  # a turn, and the profile and summary the CRM held when it arrived


def _turns(s: _State, returning: Product | None) -> list[_Made]:
    rng = s.rng
    made: list[_Made] = []

    def add(make: Any, *args: Any) -> None:
        profile, summary = "；".join(s.profile), s.summary()  # the CRM state before the turn
        made.append((make(s, *args), profile, summary))

    if rng.random() < 0.4:
        add(_chitchat, "greeting")
    if returning is not None:
        add(_followup, returning)
    else:
        add(_explicit, rng.choice(sorted(s.products.values(), key=lambda p: p.pid)), rng.choice(sorted(ph.ASK)))
    for _ in range(rng.randint(2, 5)):
        kind = _next_kind(s)
        if kind == "chitchat":
            add(_chitchat, rng.choice(("filler", "filler", "filler", "small_talk")))
        elif kind in ("switch", "line_switch"):
            add(_switch, _other(s, kind == "switch"), kind)
        elif kind == "comparison":
            add(_comparison)
        else:
            assert s.focus is not None
            add({"pronoun": _pronoun, "ellipsis": _ellipsis, "typo": _typo, "bargain": _bargain}[kind], s.focus)
    if rng.random() < 0.35:
        add(_chitchat, "closing")
    return made


def make_dialogue(products: dict[str, Product], rng: random.Random, conv_id: str) -> Conversation:
    """One dialogue (see the module doc); each user message carries the profile and summary the CRM
    held when it arrived."""
    s = _State(rng, products)
    s.learn(rng.choice(PROFILE_SEEDS))
    returning = None
    if rng.random() < 0.2:  # a returning customer: the previous session is in the CRM
        returning = rng.choice(sorted(products.values(), key=lambda p: p.pid))
        s.previous = f"上次问过{returning.name}的{ASPECT_LABELS[rng.choice(sorted(ASPECT_LABELS))]}"
        s.learn("老客户")
    messages: list[Message] = []
    for turn, profile, summary in _turns(s, returning):
        messages.append(
            Message(
                "user", turn.text, user_profile=profile, history_summary=summary, gold_doc_ids=turn.gold, kind=turn.kind
            )
        )
        messages.append(Message("assistant", turn.reply))
    for i, m in enumerate(messages):
        m.turn = i
        m.ids = {"tenant_id": "demo", "contact_id": conv_id, "account_id": "demo", "message_id": f"{conv_id}-{i}"}
    return Conversation(conv_id, messages)
