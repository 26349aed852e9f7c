"""The bundled synthetic Chinese sales demo: a product catalogue and dialogues with gold documents.

Catalogue: 5 product lines x 5 models x 8 aspects = 200 documents ``{doc_id, title, content}``
(plus ``product``, ``category``, ``aspect`` metadata; :func:`sales_demo_corpus` drops them).
``doc_id`` is ``"{product_id}-{aspect}"``, e.g. ``"phone-03-battery"``.

Dialogues: user turns that need the history, each labelled with its gold documents and a kind:

- ``explicit``: names the product ("星辰 X3 手机多少钱？");
- ``pronoun``: "它的续航怎么样？" -> the product in focus;
- ``ellipsis``: "那保修呢？" (same product, another aspect) or, after a stock question,
  "那黑色的呢？" (the stock document again);
- ``switch``: a new product of the same line mid-dialogue (becomes the focus);
- ``comparison``: "这两款哪个续航更好？" -> the aspect's documents of both products (it ends the
  dialogue, so that no later "它" is ambiguous).

Everything is drawn from ``random.Random`` seeded by strings, so a seed gives the same data on
every machine and Python version.
"""

from __future__ import annotations

import random
from typing import Any

from queryrl.apps.query_rewrite.conversations import Conversation, Message, conversations_to_rows
from queryrl.apps.query_rewrite.sft_targets import add_sft_targets

CATALOGUE_SEED = 0
SPLITS = {"train": 400, "val": 60, "test": 60}  # dialogues per split
DATA_SOURCE = "sales_demo"

# line id -> (Chinese name, price range in yuan, battery unit, spec templates)
LINES: dict[str, tuple[str, tuple[int, int], str, tuple[str, ...]]] = {
    "phone": ("手机", (1499, 7999), "mAh", ("{screen}英寸 OLED 屏", "{ram}GB 内存", "{storage}GB 存储", "{cam}万像素")),
    "laptop": ("笔记本电脑", (3999, 14999), "Wh", ("{screen}英寸 2.5K 屏", "{ram}GB 内存", "{storage}GB 固态硬盘")),
    "earphone": ("无线耳机", (199, 1999), "小时", ("主动降噪 {anc}dB", "蓝牙 5.{bt}", "单耳重 {weight} 克")),
    "watch": ("智能手表", (599, 3999), "天", ("{screen}英寸 AMOLED 屏", "{atm}ATM 防水", "血氧与心率监测")),
    "tablet": ("平板电脑", (1999, 8999), "mAh", ("{screen}英寸 LCD 屏", "{ram}GB 内存", "支持手写笔")),
}
BRANDS = ("星辰", "云帆", "极光", "青松", "锐行", "朗月", "海川", "北辰")
SERIES = ("X", "Pro", "Air", "Max", "Lite", "S", "Neo", "Ultra")
COLOURS = ("黑色", "白色", "银色", "蓝色", "绿色", "紫色", "金色", "灰色")
ASPECTS = {
    "price": "价格",
    "specs": "配置",
    "battery": "续航",
    "colors": "颜色",
    "promotion": "优惠活动",
    "warranty": "保修",
    "delivery": "配送",
    "stock": "库存",
}
PROMOTIONS = ("以旧换新最高补贴{n}元", "下单立减{n}元", "赠送价值{n}元的配件礼包", "分期 12 期免息，另减{n}元")
DELIVERY = ("顺丰包邮，一般 1-2 天送达", "京东物流，次日达", "普通快递包邮，3-5 天送达")
SCREENS = {
    "phone": ("6.1", "6.5", "6.7"),
    "laptop": ("13.3", "14", "16"),
    "watch": ("1.4", "1.5"),
    "tablet": ("11", "12.4"),
}
PROFILES = ("", "价格敏感型用户", "学生，预算有限", "商务人士，关注续航", "数码爱好者，关注配置", "给家人选购礼物")

# user-turn phrasings per aspect: (explicit with {p}, pronoun, ellipsis "那…呢")
ASK = {
    "price": ("{p}多少钱？", "它多少钱？", "那价格呢？"),
    "specs": ("{p}是什么配置？", "它的配置怎么样？", "那配置呢？"),
    "battery": ("{p}续航怎么样？", "它的续航能用多久？", "那续航呢？"),
    "colors": ("{p}有哪些颜色？", "它有几种颜色？", "那颜色呢？"),
    "promotion": ("{p}最近有优惠吗？", "它现在有什么活动？", "那优惠呢？"),
    "warranty": ("{p}保修多久？", "它的保修政策是什么？", "那保修呢？"),
    "delivery": ("{p}多久能送到？", "它发什么快递？", "那配送呢？"),
    "stock": ("{p}现在有货吗？", "它还有库存吗？", "那库存呢？"),
}
COMPARE = {
    "price": "这两款哪个更便宜？",
    "battery": "这两款哪个续航更好？",
    "specs": "这两款配置哪个更强？",
    "warranty": "这两款的保修有什么区别？",
}


def _specs(line: str, rng: random.Random) -> str:
    values = {
        "screen": rng.choice(SCREENS.get(line, ("6.1",))),
        "ram": rng.choice((8, 12, 16, 32)),
        "storage": rng.choice((128, 256, 512, 1024)),
        "cam": rng.choice((5000, 6400, 10800)),
        "anc": rng.choice((35, 40, 45, 48)),
        "bt": rng.choice((2, 3, 4)),
        "weight": rng.choice((4, 5, 6)),
        "atm": rng.choice((3, 5, 10)),
    }
    return "，".join(t.format(**values) for t in LINES[line][3])


def _battery(line: str, rng: random.Random) -> str:
    unit = LINES[line][2]
    amount = {
        "mAh": rng.randrange(4000, 10001, 100),
        "Wh": rng.randrange(50, 100),
        "小时": rng.randrange(5, 11),
        "天": rng.randrange(2, 15),
    }[unit]
    extra = {
        "mAh": f"，支持 {rng.choice((33, 67, 120))}W 快充",
        "Wh": "，轻度办公约 12 小时",
        "小时": "（单次），配合充电盒更久",
    }
    return f"电池 {amount}{unit}" + extra.get(unit, " 典型使用")


def _product_docs(pid: str, name: str, line: str, rng: random.Random) -> list[dict[str, Any]]:
    low, high = LINES[line][1]
    price = rng.randrange(low, high, 100) - 1
    colours = rng.sample(COLOURS, rng.randint(2, 4))
    stock = "；".join(f"{c}{rng.choice(('现货充足', '仅剩少量', '暂时缺货', '预计一周后到货'))}" for c in colours)
    contents = {
        "price": f"{name}售价 {price} 元，各颜色同价。",
        "specs": f"{name}配置：{_specs(line, rng)}。",
        "battery": f"{name}续航：{_battery(line, rng)}。",
        "colors": f"{name}有 {len(colours)} 种颜色：{'、'.join(colours)}。",
        "promotion": f"{name}当前活动：{rng.choice(PROMOTIONS).format(n=rng.choice((100, 200, 300, 500)))}。",
        "warranty": f"{name}享受 {rng.choice((1, 2))} 年官方保修，{rng.choice((7, 15))} 天无理由退换。",
        "delivery": f"{name}{rng.choice(DELIVERY)}。",
        "stock": f"{name}库存：{stock}。",
    }
    return [
        {
            "doc_id": f"{pid}-{aspect}",
            "title": f"{name} {ASPECTS[aspect]}",
            "content": text,
            "product": name,
            "category": line,
            "aspect": aspect,
        }
        for aspect, text in contents.items()
    ]


def make_catalogue(seed: int = CATALOGUE_SEED, models_per_line: int = 5) -> list[dict[str, Any]]:
    """The catalogue: `models_per_line` models per product line, 8 aspect documents each."""
    rng = random.Random(f"sales_demo/catalogue/{seed}")
    docs: list[dict[str, Any]] = []
    names = rng.sample([f"{b} {s}{n}" for b in BRANDS for s in SERIES for n in range(1, 10)], len(LINES) * 9)
    for li, line in enumerate(LINES):
        for k in range(models_per_line):
            name = f"{names[li * 9 + k]} {LINES[line][0]}"
            docs += _product_docs(f"{line}-{k + 1:02d}", name, line, rng)
    return docs


def _user(text: str, gold: list[str], kind: str) -> Message:
    return Message(role="user", text=text, gold_doc_ids=gold, kind=kind)


def _dialogue(products: dict[str, dict[str, dict[str, Any]]], rng: random.Random, conv_id: str) -> Conversation:
    """One dialogue of 3-6 user turns about one product line (see the module docstring)."""
    line = rng.choice(sorted({p.split("-")[0] for p in products}))
    pool = sorted(p for p in products if p.startswith(line + "-"))
    first, second = rng.sample(pool, 2)
    focus, seen = first, [first]
    profile = rng.choice(PROFILES)
    aspect = rng.choice(sorted(ASPECTS))
    turns = [_user(ASK[aspect][0].format(p=products[focus]["price"]["product"]), [f"{focus}-{aspect}"], "explicit")]
    for _ in range(rng.randint(2, 5)):
        last_aspect = aspect
        options = ["pronoun", "ellipsis"] + (["switch"] if len(seen) == 1 else ["comparison"])
        kind = rng.choice(options)
        if kind == "switch":
            focus = second
            seen.append(second)
            aspect = rng.choice(sorted(ASPECTS))
            text = "另外，" + ASK[aspect][0].format(p=products[focus]["price"]["product"])
            gold = [f"{focus}-{aspect}"]
        elif kind == "comparison":
            aspect = rng.choice(sorted(COMPARE))
            text, gold = COMPARE[aspect], [f"{p}-{aspect}" for p in seen]
        elif kind == "ellipsis" and last_aspect == "stock" and rng.random() < 0.7:
            colours = products[focus]["colors"]["content"].split("：")[-1].rstrip("。").split("、")
            text, gold = f"那{rng.choice(colours)}的呢？", [f"{focus}-stock"]
        else:
            aspect = rng.choice(sorted(set(ASPECTS) - {last_aspect}))
            text = ASK[aspect][1 if kind == "pronoun" else 2]
            gold = [f"{focus}-{aspect}"]
        turns.append(_user(text, gold, kind))
        if kind == "comparison":  # after "这两款…", a bare "它" would be ambiguous: end here
            break
    messages: list[Message] = []
    for turn in turns:
        turn.user_profile = profile
        reply = "；".join(_doc_by_id(products, g)["content"] for g in turn.gold_doc_ids)
        messages += [turn, Message(role="assistant", text=reply)]
    for i, m in enumerate(messages):
        m.turn = i
        m.ids = {"tenant_id": "demo", "contact_id": conv_id, "account_id": "demo", "message_id": f"{conv_id}-{i}"}
    return Conversation(conv_id, messages)


def _doc_by_id(products: dict[str, dict[str, dict[str, Any]]], did: str) -> dict[str, Any]:
    pid, _, aspect = did.rpartition("-")
    return products[pid][aspect]


def make_dialogues(catalogue: list[dict[str, Any]], n: int, seed: int = 0, prefix: str = "demo") -> list[Conversation]:
    """`n` dialogues over `catalogue` (from :func:`make_catalogue`), deterministic for `seed`."""
    products: dict[str, dict[str, dict[str, Any]]] = {}
    for doc in catalogue:
        pid, _, aspect = doc["doc_id"].rpartition("-")
        products.setdefault(pid, {})[aspect] = doc
    rng = random.Random(f"sales_demo/dialogues/{seed}")
    return [_dialogue(products, rng, f"{prefix}-{i:04d}") for i in range(n)]


def sales_demo_rows(split: str) -> list[dict[str, Any]]:
    """verl rows of one split (train 400, val 60, test 60 dialogues) over the default catalogue, each with
    the reference rewriter's answer as ``extra_info.sft_target`` (:mod:`.sft_targets`)."""
    if split not in SPLITS:
        raise ValueError(f"builtin://sales_demo has splits {', '.join(SPLITS)}, not {split!r}")
    seed = list(SPLITS).index(split) + 1  # distinct dialogue seeds per split, one shared catalogue
    dialogues = make_dialogues(make_catalogue(CATALOGUE_SEED), SPLITS[split], seed, prefix=f"demo-{split}")
    return add_sft_targets(conversations_to_rows(dialogues, DATA_SOURCE))


def sales_demo_corpus() -> list[dict[str, str]]:
    """The default catalogue as retrieval documents ``{doc_id, title, content}``."""
    return [{k: doc[k] for k in ("doc_id", "title", "content")} for doc in make_catalogue(CATALOGUE_SEED)]
