"""Applications built on the library (the library itself never imports this package)."""

from queryrl.apps.query_rewrite.demo_data import sales_demo_rows as _sales_demo_rows
from queryrl.apps.query_rewrite.policy_rewriter import PolicyRewriter as _PolicyRewriter
from queryrl.data.builtin import register_builtin_dataset as _register
from queryrl.rag.rewriters import REWRITERS as _REWRITERS

_register("sales_demo", _sales_demo_rows, version=8)  # builtin://sales_demo/{train,val,test}
_REWRITERS.register("policy")(_PolicyRewriter)  # the reference rewriter "policy": a model folder
