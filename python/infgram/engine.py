"""A drop-in for ``infini_gram.engine``: ``from infgram.engine import InfiniGramEngine``.

The constructor takes infini-gram's arguments and the methods take its keyword arguments and
return its dicts (``{"error": ...}`` for bad arguments). Differences: distributions are exact
(``approx`` is always ``False``); ``search_docs`` returns the first matching documents rather
than a random sample; ids at or above the separator are refused; ``attribute`` reports
infgram's maximal spans.
"""

from ._native import InfiniGramEngine

__all__ = ["InfiniGramEngine"]
