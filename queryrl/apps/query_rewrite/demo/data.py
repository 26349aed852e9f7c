"""The bundled synthetic Chinese sales demo: a product catalogue and sales chats with gold documents.

Catalogue: 5 product lines x 5 models x 8 aspects = 200 documents ``{doc_id, title, content}``
(plus ``product``, ``category``, ``aspect`` and ``facts`` metadata; :func:`sales_demo_corpus` drops
them). ``doc_id`` is ``"{product_id}-{aspect}"``, e.g. ``"phone-03-battery"``.

Dialogues (:mod:`.dialogues`, worded by :mod:`.phrases`): a customer and a sales assistant,
with greetings and small talk that need no retrieval (kind ``chitchat``, empty gold), pronouns,
ellipsis, typos, bargaining, comparisons, switches within and across product lines, a CRM profile and
a summary that change through the dialogue, and replies that paraphrase the documents.

Rows (:func:`sales_demo_rows`): the prompt's domain line is :data:`DOMAIN` (a sales assistant for
consumer electronics); the policy answers only ``{"rewritten_query": ...}``.

Everything is drawn from ``random.Random`` seeded by strings, so a seed gives the same data on
every machine and Python version.
"""

from __future__ import annotations

import random
from typing import Any

from queryrl.apps.query_rewrite.data.conversations import Conversation, conversations_to_rows
from queryrl.apps.query_rewrite.data.sft_targets import add_sft_targets
from queryrl.apps.query_rewrite.demo.dialogues import make_dialogue, products_of

CATALOGUE_SEED = 0
SPLITS = {"train": 2000, "val": 60, "test": 60}  # dialogues per split (train: experiments/logs/rewriter_learning.md)
DATA_SOURCE = "sales_demo"

# line id -> (Chinese name, price range in yuan, battery unit, spec templates)
LINES: dict[str, tuple[str, tuple[int, int], str, tuple[str, ...]]] = {
    "phone": ("手机", (1499, 7999), "mAh", ("{screen}英寸 OLED 屏", "{ram}GB 内存", "{storage}GB 存储", "{cam}万像素")),
    "laptop": ("笔记本电脑", (3999, 14999), "Wh", ("{screen}英寸 2.5K 屏", "{ram}GB 内存", "{storage}GB 固态硬盘")),
    "earphone": ("无线耳机", (199, 1999), "小时", ("主动降噪 {anc}dB", "蓝牙 5.{bt}", "单耳重 {weight} 克")),
    "watch": ("智能手表", (599, 3999), "天", ("{screen}英寸 AMOLED 屏", "{atm}ATM 防水", "血氧与心率监测")),
    "tablet": ("平板电脑", (1999, 8999), "mAh", ("{screen}英寸 LCD 屏", "{ram}GB 内存", "支持手写笔")),
}
DOMAIN = "电子产品销售客服"  # the prompt's domain line (naming the five lines cost 15 prompt tokens)
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


def _specs(line: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
    """The spec sentence of a model and the values it was made of (for the assistant's paraphrase)."""
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
    return "，".join(t.format(**values) for t in LINES[line][3]), values


def _battery(line: str, rng: random.Random) -> tuple[str, dict[str, Any]]:
    unit = LINES[line][2]
    amounts = {
        "mAh": rng.randrange(4000, 10001, 100),
        "Wh": rng.randrange(50, 100),
        "小时": rng.randrange(5, 11),
        "天": rng.randrange(2, 15),
    }
    watts = rng.choice((33, 67, 120))
    extra = {"mAh": f"，支持 {watts}W 快充", "Wh": "，轻度办公约 12 小时", "小时": "（单次），配合充电盒更久"}
    text = f"电池 {amounts[unit]}{unit}" + extra.get(unit, " 典型使用")
    return text, {"amount": amounts[unit], "unit": unit, "watts": watts}


def _product_docs(pid: str, name: str, line: str, rng: random.Random) -> list[dict[str, Any]]:
    """The 8 aspect documents of one model; each keeps the facts it states in ``facts`` (the random draws
    happen in the same order as when the documents were the only output, so the corpus is unchanged)."""
    low, high = LINES[line][1]
    price = rng.randrange(low, high, 100) - 1
    colours = rng.sample(COLOURS, rng.randint(2, 4))
    states = [rng.choice(("现货充足", "仅剩少量", "暂时缺货", "预计一周后到货")) for _ in colours]
    stock = "；".join(f"{c}{s}" for c, s in zip(colours, states, strict=True))
    specs, spec_values = _specs(line, rng)
    battery, battery_facts = _battery(line, rng)
    promo, promo_n = rng.choice(PROMOTIONS), rng.choice((100, 200, 300, 500))
    years, days = rng.choice((1, 2)), rng.choice((7, 15))
    delivery = rng.choice(DELIVERY)
    contents = {
        "price": f"{name}售价 {price} 元，各颜色同价。",
        "specs": f"{name}配置：{specs}。",
        "battery": f"{name}续航：{battery}。",
        "colors": f"{name}有 {len(colours)} 种颜色：{'、'.join(colours)}。",
        "promotion": f"{name}当前活动：{promo.format(n=promo_n)}。",
        "warranty": f"{name}享受 {years} 年官方保修，{days} 天无理由退换。",
        "delivery": f"{name}{delivery}。",
        "stock": f"{name}库存：{stock}。",
    }
    facts: dict[str, dict[str, Any]] = {
        "price": {"price": price},
        "specs": {"line": line, **spec_values},
        "battery": battery_facts,
        "colors": {"colours": colours},
        "promotion": {"template": promo, "n": promo_n},
        "warranty": {"years": years, "days": days},
        "delivery": {"text": delivery},
        "stock": {"colours": colours, "states": states},
    }
    return [
        {
            "doc_id": f"{pid}-{aspect}",
            "title": f"{name} {ASPECTS[aspect]}",
            "content": text,
            "product": name,
            "category": line,
            "aspect": aspect,
            "facts": facts[aspect],
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


def make_dialogues(catalogue: list[dict[str, Any]], n: int, seed: int = 0, prefix: str = "demo") -> list[Conversation]:
    """`n` dialogues over `catalogue` (from :func:`make_catalogue`), deterministic for `seed`."""
    products = products_of(catalogue)
    rng = random.Random(f"sales_demo/dialogues/{seed}")
    return [make_dialogue(products, rng, f"{prefix}-{i:04d}") for i in range(n)]


def sales_demo_rows(split: str) -> list[dict[str, Any]]:
    """verl rows of one split (train 2000, val 60, test 60 dialogues) over the default catalogue, each with
    the reference rewriter's answer as ``extra_info.sft_target`` (:mod:`.sft_targets`)."""
    if split not in SPLITS:
        raise ValueError(f"builtin://sales_demo has splits {', '.join(SPLITS)}, not {split!r}")
    seed = list(SPLITS).index(split) + 1  # distinct dialogue seeds per split, one shared catalogue
    dialogues = make_dialogues(make_catalogue(CATALOGUE_SEED), SPLITS[split], seed, prefix=f"demo-{split}")
    return add_sft_targets(conversations_to_rows(dialogues, DATA_SOURCE, domain=DOMAIN))


def sales_demo_corpus() -> list[dict[str, str]]:
    """The default catalogue as retrieval documents ``{doc_id, title, content}``."""
    return [{k: doc[k] for k in ("doc_id", "title", "content")} for doc in make_catalogue(CATALOGUE_SEED)]
