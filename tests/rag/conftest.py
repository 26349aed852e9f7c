"""A small Chinese + English phone catalogue shared by the RAG tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from queryrl.rag import BM25Index, Document, HeuristicRewriter, make_app
from queryrl.testing.judge_server import running_server

PHONES = [  # (key, name, price, colours, warranty years)
    ("huawei", "华为 Mate 60", 5999, "雅丹黑、白沙银、南糯紫", 1),
    ("iphone", "iPhone 15", 5999, "黑色、蓝色、粉色、黄色", 1),
    ("xiaomi", "小米 14", 3999, "黑色、白色、岩石青", 2),
    ("oppo", "OPPO Find X7", 4499, "大漠银月、海阔天空", 1),
    ("vivo", "vivo X100", 3999, "辰夜黑、白月光", 2),
    ("honor", "荣耀 Magic6", 4399, "绒黑色、祁连雪", 1),
]


def build_corpus() -> list[Document]:
    docs: list[Document] = []
    for key, name, price, colours, years in PHONES:
        docs.append(Document(f"{key}-price", f"{name} 价格", f"{name} 官方售价 {price} 元，多少钱以门店为准。", {}))
        docs.append(Document(f"{key}-colour", f"{name} 颜色", f"{name} 有这些配色：{colours}。", {}))
        docs.append(Document(f"{key}-warranty", f"{name} 保修", f"{name} 整机保修 {years} 年，电池保修一年。", {}))
    docs.append(Document("policy-return", "退货政策", "七天无理由退货，商品需保持完好。", {}))
    docs.append(Document("policy-shipping", "配送说明", "全国包邮，一般三天内送达。Free shipping nationwide.", {}))
    return docs


@pytest.fixture(scope="session")
def corpus() -> list[Document]:
    return build_corpus()


@pytest.fixture(scope="session")
def index(corpus: list[Document]) -> BM25Index:
    return BM25Index(corpus)


@pytest.fixture(scope="module")
def rag_url(index: BM25Index) -> Iterator[str]:
    """The real RAG service on loopback (base URL without a trailing slash); ``app.state`` via ``rag_app``."""
    app = make_app(index, HeuristicRewriter(), top_k=5)
    with running_server(app, max_lifetime_s=120) as url:
        yield url.removesuffix("/v1")
