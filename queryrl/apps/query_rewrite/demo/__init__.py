"""The demo's synthetic sales chat (builtin://sales_demo)."""
