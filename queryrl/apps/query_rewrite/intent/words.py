"""The word lists of the offline intent check (:mod:`.intent`): question types, function words, generic nouns.

Tables only. Every entry is matched on NFKC-normalised, lowercased text with the spaces removed
(:func:`~.intent.reading.normalise`). The demo's own phrasings (:mod:`~.demo.phrases`: ``ASK``, ``ASPECT_WORDS``,
``ELLIPSIS``) and KdConv's travel questions are what these lists were written against;
``tests/apps/query_rewrite/intent/test_check.py`` checks that every demo aspect word and question falls in its type.
"""

from __future__ import annotations

# --- question types ------------------------------------------------------------------------------
# cue -> the question types it asks about. A cue with two types (便宜: price or promotion; 售后: warranty
# or return) is satisfied by either. Cues are matched longest first and a matched span is not matched
# again, so "马上发货" (stock) is not also "发货" (shipping) and "手机号" (phone) is not the product 手机.
_TYPES: dict[str, tuple[str, ...]] = {
    "price": (
        "多少钱", "价格", "价钱", "售价", "价位", "卖多少", "标价", "报价", "费用", "收费", "几块",
        "多少块", "价", "性价比", "贵不贵", "贵吗", "降价",
    ),
    "price|promotion": ("便宜", "到手价", "底价", "最低价", "最低多少", "少点", "低点", "砍价", "太贵", "有点贵"),
    "promotion": (
        "优惠", "活动", "折扣", "打折", "打几折", "赠品", "送点", "送个", "以旧换新", "旧换新", "优惠券", "免息",
        "分期", "补贴", "立减", "满减", "促销", "团购",
    ),
    "warranty": ("保修", "质保", "保固", "坏了", "维修", "修吗", "保多久"),
    "warranty|return": ("售后",),
    "return": ("退货", "退换", "退款", "无理由", "能退", "可以退", "退吗", "换货", "能换", "包退", "七天无理由"),
    "shipping": (
        "发货", "快递", "物流", "配送", "包邮", "邮费", "运费", "送到", "到货", "能到", "几天到", "送货",
        "顺丰", "寄", "从哪发", "哪里发", "送达", "几点发", "几点到", "几点能到",
    ),
    "stock": ("有货", "没货", "库存", "现货", "缺货", "货源", "补货", "还有货", "断货", "卖完"),
    "stock|shipping": ("马上发", "能发吗", "现在发", "今天发"),
    "specs": (
        "配置", "参数", "性能", "内存", "存储", "屏幕", "处理器", "芯片", "像素", "摄像", "分辨率", "尺寸",
        "重量", "多重", "cpu", "gpu", "ram", "显卡", "硬盘", "规格", "屏",
    ),
    "battery": ("续航", "电池", "待机", "充电", "快充", "耗电", "电量", "毫安", "能用多久"),
    "colors": ("颜色", "配色", "什么色", "几种色", "几个色", "色系"),
    "phone": ("电话", "联系方式", "手机号", "号码", "热线", "联系电话", "怎么联系"),
    "address": (
        "地址", "在哪", "哪里", "哪儿", "什么地方", "位置", "位于", "坐落", "怎么去", "怎么走", "路线", "交通",
    ),
    # KdConv travel's two fields its speakers ask in their own words: the suggested visiting time
    # (建议游玩时间, "能玩多久") and the sights nearby (周边景点, "附近有什么好玩的")
    "duration": (
        "建议游玩时间", "游玩时间", "游玩时长", "游玩的时间", "游玩多久", "玩多久", "玩多长时间", "玩多长",
        "玩几个小时", "逛多久", "待多久", "游玩需要多长时间", "游玩要多长时间", "游玩大概要多长时间",
    ),  # not 多久 / 多长时间 alone: "保修多长时间" asks the warranty
    "nearby": (
        "周边景点", "周边的景点", "周边", "附近的景点", "附近景点", "附近有什么", "附近有啥", "附近还有",
        "附近的", "边上还有",
    ),
    "hours": (
        "开放时间", "营业时间", "几点", "开门", "关门", "闭馆", "开馆", "开放", "营业",
    ),
    "date": ("哪年", "年份", "哪一年", "几几年", "建于", "建成", "始建", "成立", "上映", "发行", "出生", "日期"),
    "ticket|price": ("门票", "票价", "买票", "购票", "票"),
    "booking": ("预约", "预订", "预定", "订票"),
    "rating": ("评分", "评价", "口碑", "好评", "差评", "几星"),
    "boxoffice": ("票房",),
    "people": ("导演", "主演", "演员", "谁演", "谁唱", "歌手", "演唱", "作词", "作曲", "作者", "创始人", "设计师"),
    "weather": ("天气", "气温", "下雨"),
    "area": ("面积", "多大面积", "占地"),
}  # fmt: skip

QUESTION_CUES: dict[str, frozenset[str]] = {
    cue: frozenset(types.split("|")) for types, cues in _TYPES.items() for cue in cues
}
# a question type that implies another: a ticket's document holds its price
IMPLIES: dict[str, frozenset[str]] = {"ticket": frozenset({"price"})}

# --- what makes a clause a question ----------------------------------------------------------------
QUESTION_MARKERS: tuple[str, ...] = (
    "?", "吗", "呢", "什么", "多少", "哪", "几", "怎", "如何", "是否", "有没有", "能不能", "可不可以", "是不是",
    "会不会", "行不行", "要不要", "谁", "啥", "咋", "为何", "为什么", "么", "多久", "多大", "多长", "多远",
    "说说", "讲讲", "介绍", "发我",  # requests: "说说折扣", "发我看看"
)  # fmt: skip
CLAUSE_BREAKS = "，,。.！!？?；;～~…\n"

# --- function words: never content ---------------------------------------------------------------
STOPWORDS: frozenset[str] = frozenset(
    (
        # pronouns and references the rewrite resolves from the history
        "这个", "那个", "这款", "那款", "这台", "那台", "这副", "那副", "这块", "那块", "这部", "这只", "这种",
        "那种", "这些", "那些", "它", "它们", "他", "她", "他们", "这", "那", "这里", "那里", "这儿", "那儿",
        "这边", "那边", "里面", "里边", "此", "该", "其", "上次", "之前", "刚才", "刚刚", "上回", "前面", "那家",
        "这家", "我", "你", "您", "我们", "你们", "咱们", "自己", "人家", "大家",
        # question words and particles
        "什么", "多少", "哪", "哪个", "哪些", "哪款", "怎么", "怎么样", "怎样", "如何", "几", "几个", "多久",
        "多大", "吗", "呢", "吧", "啊", "呀", "哦", "嘛", "啦", "了", "的", "地", "得", "着", "过", "么",
        "是否", "有没有", "能不能", "可不可以", "是不是", "会不会", "行不行", "要不要", "啥", "咋", "谁",
        "为什么", "为何", "的话", "呗", "哈", "嗯", "哎", "喂", "诶", "吖", "哇", "咯", "呐",
        # verbs and adverbs that frame a question
        "是", "有", "在", "能", "可以", "会", "要", "想", "想要", "问", "问下", "问问", "请问", "问一下",
        "知道", "告诉", "介绍", "介绍一下", "说说", "说一下", "讲讲", "看看", "看", "看下", "看一下", "发",
        "发我", "给", "给我", "帮", "帮我", "一下", "下", "再", "还", "还有", "还是", "也", "都", "就", "又",
        "更", "最", "很", "太", "挺", "比较", "一般", "大概", "大约", "现在", "目前", "最近", "平时", "顺便",
        "另外", "对了", "然后", "那么", "所以", "但是", "不过", "如果", "方面", "情况", "具体", "一些",
        "一点", "点", "和", "跟", "与", "及", "或", "或者", "以及", "把", "被", "让", "对", "从", "向",
        "到", "去", "来", "用", "能用", "买", "卖", "不", "没", "没有", "别", "多", "少", "好", "行", "可",
        "说实话", "诚心要", "老板", "亲", "麻烦", "打扰", "打扰一下", "请", "谢谢", "你好", "您好", "好的",
        "嗯嗯", "哦哦", "哈哈", "再问", "再问下", "另外想问下", "顺便问一下", "我想问下", "想问下", "想问",
        "咨询", "咨询一下", "了解", "了解一下", "推荐", "一个", "个", "款", "台", "种", "次", "下次", "需要",
        "应该", "可能", "支持", "算", "实际", "真的", "一共", "总共", "觉得", "认为",
        # comparisons, ranges and judgements that frame the question, not its subject
        "区别", "差别", "不同", "一样", "对比", "相比", "比", "力度", "耐用", "好用", "划算", "实用", "值得",
        "靠谱", "不快", "快不快", "好不好", "换成", "换", "别的", "其他", "以内", "以上", "以下", "左右", "之间",
        "搞定", "别家", "两款", "两个", "这俩", "哪个好", "更好", "更强",
        # latin small talk
        "hello", "hi", "ok", "okay", "hey", "thanks", "thx", "pls", "please",
    )
)  # fmt: skip
# single characters that end a run of unknown single characters (see intent._words): function characters
STOP_CHARS: frozenset[str] = frozenset(
    "的了吗呢吧啊呀哦嘛啦是有在和与跟及或也都就还又再很太最更能会要想问看说给发把被让对从向往到去来上下里中个"
    "这那它他她我你您谁啥几多少么怎咋哪不没别可以得地着过用买卖吖哈嗯哎喂呗款台只副块部种次点"
)
# nouns that name a kind of thing, not which one: a rewrite may drop them (the product's name says
# which), but not put another kind in their place
CATEGORY_WORDS: frozenset[str] = frozenset(
    (
        "手机", "平板", "平板电脑", "电脑", "笔记本", "笔记本电脑", "耳机", "无线耳机", "蓝牙耳机", "手表",
        "智能手表", "手环", "相机", "电视", "音箱", "景点", "景区", "公园", "博物馆", "餐厅", "酒店", "电影",
        "歌曲", "专辑", "歌",
    )
)  # fmt: skip
# nouns too general to carry a question on their own: a rewrite may drop them
GENERIC_WORDS: frozenset[str] = frozenset(
    (
        "政策", "信息", "问题", "东西", "产品", "商品", "地方", "时候", "详情", "详细", "情况", "服务", "方式",
        "办法", "方法", "东东", "这边", "具体", "相关", "规定", "标准", "细节", "内容", "介绍", "特点", "资料",
        "新款", "这一款", "型号",
    )
)  # fmt: skip
# "answer" cues: a question word followed by one of these and a value is an answer, not a question ("地址在北京市…",
# as KdConv's speakers tell an address; "地址在哪" still asks: a clause with a question marker never tells)
ANSWER_LINKS = ("是", "为", ":", "：", "就是", "在")
ANSWER_VERBS = ("位于", "坐落于", "坐落在", "开放时间为", "营业时间为")
