"""Applications built on the library; the library itself never imports this package.

Each application is a plugin (:class:`queryrl.application.Application`) published under the
``queryrl.apps`` entry-point group in ``pyproject.toml``; :func:`queryrl.application.load_apps`
finds it and runs its ``setup`` (built-in datasets, rewriters).
"""
