"""infgram: an ∞-gram engine over suffix-array indexes, from Rust.

* ``infgram.engine.InfiniGramEngine`` — a drop-in for ``infini_gram.engine.InfiniGramEngine``:
  change the import line, keep the index (infini-gram's own indexes are opened as they are).
* ``infgram.Index`` — infgram's own API: the JSON query protocol of ``infgram query --batch`` and
  ``infgram serve`` (``query``), SBIS generation (``generate``) and perplexity (``perplexity``).
* ``infgram.build_index`` — index a corpus of .txt / .jsonl[.gz|.zst] files (``tokenizer="words",
  sentences=True`` for classic n-gram models).
* ``Index.ngram_model(order, "mkn")`` — a fixed-order model equal to KenLM's ``lmplz`` model
  (``score``, ``perplexity``, ``export_arpa``), or ``"add_alpha"``.

Every query releases the GIL while it runs.
"""

import json as _json
from typing import Any, Dict

from . import _native
from ._native import build_index, build_index_from_ids

__version__ = _native.__version__
__all__ = ["Index", "build_index", "build_index_from_ids", "engine"]


class Index(_native.Index):
    """An infgram (or infini-gram) index directory with its tokenizer."""

    def query(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Answers one query of infgram's protocol, e.g. ``{"query_type": "count", "text": "the cat"}``;
        returns the answer, or ``{"error": ...}``."""
        return _json.loads(self.query_json(_json.dumps(request)))


from . import engine  # noqa: E402  (after Index: engine re-exports the native class)
