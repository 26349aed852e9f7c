"""The known slips of typed Chinese that the offline intent check reads as meant: typo -> the word it stands for.

Homophones and near-misses of words customers ask about ("续行" for 续航, "包修" for 保修) and of the sales
demo's brand names ("星晨" for 星辰). :func:`~queryrl.apps.query_rewrite.intent.reading.normalise` replaces
each by its word before a text is read, so a rewrite that fixes a customer's slip keeps the question and one
that copies it does not look garbled.

Tables only. They belong to the intent check; the sales demo's dialogues
(:mod:`queryrl.apps.query_rewrite.demo.dialogues`) draw their typos from them, so every slip the demo makes is
one the check knows.
"""

from __future__ import annotations

# word -> the slips typed for it, applied to one word of a question
HOMOPHONES: dict[str, tuple[str, ...]] = {
    "续航": ("续行", "序航", "续杭"),
    "保修": ("包修", "保休"),
    "配置": ("配制", "佩置"),
    "颜色": ("言色", "颜涩"),
    "库存": ("库村", "裤存"),
    "优惠": ("优会", "忧惠"),
    "多少钱": ("多少前", "都少钱"),
    "价格": ("价个", "架格"),
    "快递": ("快第", "块递"),
    "送到": ("送道",),
    "有货": ("有或",),
    "便宜": ("便意", "变宜"),
    "电池": ("电尺", "店池"),
    "活动": ("活东",),
    "参数": ("参素",),
    "手机": ("首机",),
    "耳机": ("尔机",),
    "电脑": ("电恼",),
    "平板": ("平版",),
    "手表": ("首表",),
}
BRAND_HOMOPHONES = {
    "星辰": "星晨",
    "云帆": "云凡",
    "极光": "级光",
    "青松": "清松",
    "锐行": "瑞行",
    "朗月": "郎月",
    "海川": "海穿",
    "北辰": "北晨",
}
