"""Applications built on the library (the library itself never imports this package)."""

from queryrl.apps.query_rewrite.demo_data import sales_demo_rows as _sales_demo_rows
from queryrl.data.builtin import register_builtin_dataset as _register

_register("sales_demo", _sales_demo_rows, version=3)  # builtin://sales_demo/{train,val,test}
