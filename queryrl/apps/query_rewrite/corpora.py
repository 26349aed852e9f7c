"""The embedded RAG service's built-in corpora, by name, as the library's built-in datasets are.

``app.query_rewrite.rag.corpus`` (and ``--corpus``) names a registered corpus (``sales_demo``: the demo's
product catalogue), a registered corpus with an argument (``kdconv:KB_PATH``: the documents of a KdConv
knowledge base), or else a corpus file (:func:`queryrl.rag.load_corpus`). The application's plugin registers
its corpora in its ``setup`` (:func:`register_corpus`), as it registers ``builtin://sales_demo`` with
:func:`queryrl.data.builtin.register_builtin_dataset`; :func:`find_corpus` finds the installed applications
first (:func:`queryrl.application.load_apps`), as :func:`queryrl.data.builtin.builtin_datasets` does. So this
leaf imports neither the demo nor the KdConv reader, and the reward that retrieves from a corpus
(:mod:`.reward.rag`) imports only this.

Only the standard library and :mod:`queryrl.application` (lazily) are imported here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# the documents of a corpus: its argument ("" for one without) -> [{"doc_id", "title", "content"}, ...]
MakeDocuments = Callable[[str], list[dict[str, Any]]]


@dataclass(frozen=True)
class BuiltinCorpus:
    """A corpus made in code.

    Attributes:
        documents: its argument (``""`` for a corpus named without one) -> its documents.
        argument: named as ``NAME:ARGUMENT`` (what the argument is, for messages: e.g. ``"KB_PATH"``), or
            None: named alone.
        title_entities: the titles are the entity dictionary of the index and of the reference rewriter
            (:func:`queryrl.rag.index.title_entities`; a corpus file's always are); False: the heuristic
            rewriter's own (the sales demo's product names).
        latin_entities: with title entities, Latin words and digits count as entities too (False for a
            KdConv knowledge base, whose names are Chinese and whose digits are years, prices and hours).
    """

    documents: MakeDocuments
    argument: str | None = None
    title_entities: bool = True
    latin_entities: bool = True


CORPORA: dict[str, BuiltinCorpus] = {}


def register_corpus(name: str, corpus: BuiltinCorpus) -> None:
    """Make `name` (``NAME`` or, with ``corpus.argument``, ``NAME:ARGUMENT``) a corpus; an application calls
    this in its ``setup``. Registering a name again with another corpus is refused."""
    if not name or ":" in name:
        raise ValueError(f"a corpus name is a word without ':', got {name!r}")
    existing = CORPORA.get(name)
    if existing is not None and existing != corpus:
        raise ValueError(f"built-in corpus {name!r} is already registered")
    CORPORA[name] = corpus


def find_corpus(spec: str) -> tuple[BuiltinCorpus, str] | None:
    """The built-in corpus `spec` names and its argument (``""`` for none), or None for a corpus file.

    Raises:
        ValueError: `spec` is the name of a corpus that takes an argument, given without one.
    """
    from queryrl.application import load_apps

    load_apps()  # each application's setup registers its corpora
    name, colon, argument = spec.partition(":")
    corpus = CORPORA.get(name)
    if corpus is None:
        return None
    if corpus.argument is None:
        return (corpus, "") if not colon else None  # "sales_demo:x" is a file's name
    if not colon or not argument:
        raise ValueError(f"corpus {spec!r}: name it as {name}:{corpus.argument}")
    return corpus, argument


def builtin_documents(spec: str) -> list[dict[str, Any]] | None:
    """The documents of the built-in corpus `spec` names (:func:`find_corpus`), None for a corpus file."""
    found = find_corpus(spec)
    if found is None:
        return None
    corpus, argument = found
    return corpus.documents(argument)
