"""Stand-ins of the services a queryrl run talks to, for tests, benchmarks and rehearsing offline.

- :mod:`.judge_server`: an OpenAI-compatible chat server backed by a local judge function (``queryrl
  serve-judge``), with :mod:`.openai_rules`, OpenAI's refusals of GPT-5 / o-series request settings.

The library never imports this package (``tests/test_layering.py``); only the ``serve-judge`` command does.
"""
