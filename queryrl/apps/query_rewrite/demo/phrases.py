"""The wording of the sales demo's dialogues (:mod:`.dialogues`): what customers type and how the
assistant paraphrases the catalogue (the slips customers make are the intent check's :mod:`~.intent.slips`).

Tables only, no logic but small formatting helpers. Every user phrasing is built from parts (an
opener, a core question, a particle, sometimes a remark about the customer) so that the same
question rarely reads the same twice: in the generated data at least 80 % of user turns are
distinct (``tests/apps/query_rewrite/demo/test_data.py`` measures it).
"""

from __future__ import annotations

# --- user questions about one aspect of a product --------------------------------------------------
# {p}: the product (a full name, a short form, or a pronoun such as "它" / "这款")
ASK: dict[str, tuple[str, ...]] = {
    "price": ("{p}多少钱", "{p}现在卖多少", "{p}什么价位", "{p}的价格是多少", "{p}要多少钱啊", "{p}售价多少"),
    "specs": ("{p}是什么配置", "{p}配置怎么样", "{p}的参数发我看看", "{p}内存多大", "{p}性能如何", "{p}屏幕多大"),
    "battery": ("{p}续航怎么样", "{p}电池能用多久", "{p}续航能撑一天吗", "{p}电池多大", "{p}耗电快不快"),
    "colors": ("{p}有哪些颜色", "{p}有几个颜色可选", "{p}都有什么配色", "{p}有没有别的颜色"),
    "promotion": ("{p}最近有优惠吗", "{p}有什么活动", "{p}现在有折扣吗", "{p}有没有赠品", "{p}能以旧换新吗"),
    "warranty": ("{p}保修多久", "{p}保修政策是什么", "{p}坏了怎么保修", "{p}能七天无理由退吗", "{p}售后怎么样"),
    "delivery": ("{p}多久能送到", "{p}发什么快递", "{p}包邮吗", "{p}几天能到货", "{p}从哪里发货"),
    "stock": ("{p}现在有货吗", "{p}还有库存吗", "{p}能马上发货吗", "{p}缺货吗", "{p}现货还有吗"),
}
# the aspect named on its own, for ellipsis ("那续航呢？")
ASPECT_WORDS: dict[str, tuple[str, ...]] = {
    "price": ("价格", "价钱", "售价"),
    "specs": ("配置", "参数", "性能"),
    "battery": ("续航", "电池", "待机"),
    "colors": ("颜色", "配色"),
    "promotion": ("优惠", "活动", "折扣"),
    "warranty": ("保修", "售后", "质保"),
    "delivery": ("配送", "快递", "物流"),
    "stock": ("库存", "现货", "货源"),
}
ELLIPSIS = ("那{a}呢", "{a}呢", "那{a}方面呢", "{a}这块呢", "再问下{a}", "那{a}怎么样", "{a}的话呢", "说说{a}")
STOCK_COLOUR = ("那{c}的呢", "{c}的还有吗", "{c}有货吗", "那{c}呢", "{c}的能发吗")
PRONOUNS = ("它", "这款", "这个", "{m}")  # {m}: the measure-word form, e.g. "这台"
MEASURE = {"phone": "这台", "laptop": "这台", "earphone": "这副", "watch": "这块", "tablet": "这台"}
OPENERS = (
    "",
    "",
    "",
    "那",
    "请问",
    "对了，",
    "还有，",
    "嗯，",
    "另外想问下，",
    "好的，",
    "哦哦，",
    "我想问下，",
    "顺便问一下，",
)
PARTICLES = ("？", "？", "?", "呀？", "啊？", "", "。", "？？")
# a remark about the customer, put before a question now and then (and what it tells the CRM)
REMARKS: tuple[tuple[str, str], ...] = (
    ("我平时打游戏比较多，", "常玩游戏"),
    ("主要给孩子上网课用，", "给孩子上网课"),
    ("我经常出差，", "经常出差"),
    ("想送女朋友，", "送女朋友"),
    ("给我爸妈买的，", "给父母买"),
    ("我是学生党，", "学生"),
    ("公司采购用，", "公司采购"),
    ("平时跑步戴，", "运动时用"),
    ("我上下班地铁上用，", "通勤时用"),
    ("预算不太多，", "预算有限"),
)
BUDGET_REMARKS = ("我预算{b}左右，", "预算大概{b}，", "{b}以内能搞定吗，", "我只有{b}的预算，")

# --- comparisons of two products -------------------------------------------------------------------
COMPARE: dict[str, tuple[str, ...]] = {
    "price": ("这两款哪个更便宜", "这两个价格差多少", "两款哪个划算", "{a}和{b}哪个便宜"),
    "battery": ("这两款哪个续航更好", "两个哪个电池更耐用", "{a}和{b}哪个续航久", "续航的话这俩哪个强"),
    "specs": ("这两款配置哪个更强", "两款性能差别大吗", "{a}跟{b}配置比怎么样", "这俩参数有啥区别"),
    "warranty": ("这两款的保修有什么区别", "两个保修一样吗", "{a}和{b}售后有区别吗"),
    "promotion": ("这两款哪个优惠力度大", "两个的活动哪个划算", "{a}和{b}哪个折扣多"),
}

# --- bargaining: gold is the focus product's promotion (and price) ---------------------------------
BARGAIN_PROMOTION = (
    "能便宜点吗",
    "还能再优惠点吗",
    "有没有优惠券",
    "老客户有折扣吗",
    "便宜{n}卖不卖",
    "太贵了，能少点吗",
    "学生有优惠吗",
    "送点东西呗",
    "再送个赠品行不行",
    "买两个能打折吗",
)
BARGAIN_PRICE = ("最低多少", "到手价多少", "最低能给到多少钱", "实际到手多少钱", "底价多少", "少{n}行吗，最低价多少")
BARGAIN_OPENERS = ("", "", "老板，", "这个价格有点高，", "说实话有点贵，", "嗯…", "亲，", "别家更便宜，", "诚心要，")

# --- turns that need no retrieval (kind "chitchat", empty gold) ------------------------------------
GREETINGS = (
    "在吗",
    "你好",
    "您好",
    "hello",
    "哈喽",
    "有人吗",
    "客服在吗",
    "亲在吗",
    "你好，在吗",
    "早上好",
    "晚上好",
    "您好，想咨询一下",
    "在不在",
    "hi",
    "打扰一下",
)
GREETING_TAILS = ("", "？", "?", "～", "！", "。", "呀", "？？")
GREETING_HEADS = ("", "", "喂，", "嗨，", "哎，")
FILLERS = (
    "哈哈",
    "哈哈哈",
    "嗯嗯",
    "好的",
    "好",
    "哦哦",
    "明白了",
    "懂了",
    "原来如此",
    "这样啊",
    "了解",
    "行",
    "ok",
    "收到",
    "可以可以",
    "有点心动",
)
FILLER_TAILS = ("", "，我看看", "，我想想", "，稍等我看下", "，谢谢", "。", "！", "～", "，挺好的", "，不错")
CLOSINGS = (
    "谢谢",
    "谢谢啦",
    "多谢",
    "好的我再想想",
    "我再考虑考虑",
    "行，我回去商量一下",
    "先这样吧",
    "拜拜",
    "等我发工资再来",
    "我跟家里人商量下",
    "好的，有需要再找你",
    "感谢耐心解答",
    "我再对比一下别家",
    "回头再说吧",
)
CLOSING_TAILS = ("", "！", "。", "～", "，辛苦了", "，谢谢你", "哈")
SMALL_TALK = (
    "你是机器人吗",
    "你们客服回得真快",
    "我就随便看看",
    "稍等，我接个电话",
    "今天好热啊",
    "等下再聊",
    "你们店开了多久了",
    "刚才网有点卡",
    "我先去吃个饭",
    "你们周末也上班吗",
)

# --- assistant replies: paraphrases of the catalogue facts, never its sentences --------------------
# {r}: how the reply refers to the product ("这款", its model "X3", brand + model, or nothing)
REPLY_PRICE = (
    "{r}现在卖 {price} 块{tail}",
    "{r}价格是 {price}{tail}",
    "{r}{price} 就能拿下{tail}",
    "目前{r}标价 {price}{tail}",
)
PRICE_TAILS = ("，颜色不影响价格", "，哪个颜色都一样", "", "哦", "，性价比挺高的")
REPLY_PROMOTION = {
    "以旧换新最高补贴": "可以以旧换新，旧机最多能抵 {n}",
    "下单立减": "现在下单直接减 {n}",
    "赠送价值": "买就送一个值 {n} 的配件包",
    "分期 12 期免息": "支持分 12 期不要利息，还能再便宜 {n}",
}
REPLY_DELIVERY = {
    "顺丰包邮": "走顺丰，不收运费，一两天就到",
    "京东物流": "京东物流发货，一般第二天能到",
    "普通快递包邮": "普通快递免运费，三到五天到",
}
STOCK_STATES = {
    "现货充足": "货很足",
    "仅剩少量": "只剩几台了",
    "暂时缺货": "暂时没货",
    "预计一周后到货": "大概下周到",
}
CN_NUMBERS = ("零", "一", "两", "三", "四", "五", "六", "七", "八", "九", "十")
CHITCHAT_REPLIES = {
    "greeting": ("在的，您好！想了解哪款产品？", "您好，我在的，请问有什么可以帮您？", "在呢亲，想看点什么？"),
    "filler": ("好的，还有想了解的随时问我～", "嗯嗯，您慢慢看", "好嘞，有问题直接说就行"),
    "closing": ("不客气，有需要随时找我！", "好的，想好了随时联系我～", "没问题，祝您生活愉快！"),
    "small_talk": ("哈哈，我一直在线的，有问题随时问～", "好的，不着急，您慢慢来", "嗯嗯，您先忙～"),
}
BARGAIN_REPLIES = (
    "价格已经是活动价了，不过{promo}",
    "这个价真的很实在了，{promo}",
    "我帮您看了下，{promo}",
    "优惠的话，{promo}",
)


def cn_count(n: int) -> str:
    """A small count in Chinese words: 2 -> "两", 10 -> "十" (else the digits)."""
    return CN_NUMBERS[n] if 0 <= n < len(CN_NUMBERS) else str(n)
