"""infgram: an ∞-gram engine over suffix-array indexes, from Rust.

* ``infgram.engine.InfiniGramEngine`` — a drop-in for ``infini_gram.engine.InfiniGramEngine``:
  change the import line, keep the index (infini-gram's own indexes are opened as they are).
* ``infgram.Index`` — infgram's own API: the JSON query protocol of ``infgram query --batch`` and
  ``infgram serve`` (``query``), SBIS generation (``generate``) and perplexity (``perplexity``).
* ``infgram.build_index`` — index a corpus of .txt / .jsonl[.gz|.zst] files (``tokenizer="words",
  sentences=True`` for classic n-gram models).
* ``Index.infgram_rows(tokens)`` — every position's ∞-gram next-token distribution of a token
  sequence in one call (numpy arrays), and ``InfgramRows.mix`` / ``mix_targets``: a saved mixer
  applied to your own model's logits (PyTorch, Hugging Face), outside infgram's runtime.
* ``infgram.Model("smollm2-135m", index=...)`` — a neural model run by infgram: ``generate``
  (plain, speculative, mixed with the ∞-gram, guarded: the report of ``infgram gen --json``),
  and ``step`` / ``rollback`` for :func:`infgram.speculative.generate`.
* ``Index.ngram_model(order, "mkn")`` — a fixed-order model equal to KenLM's ``lmplz`` model
  (``score``, ``perplexity``, ``export_arpa``), or ``"add_alpha"``.

Every query releases the GIL while it runs.
"""

import json as _json
import os as _os
from typing import Any, Dict, Optional, Union

from . import _native
from ._native import Draft, Drafter, build_index, build_index_from_ids
from . import speculative

__version__ = _native.__version__
__all__ = ["Index", "InfgramRows", "mixer_estimator", "build_index", "build_index_from_ids", "engine",
           "Drafter", "Draft", "speculative", "Model"]


class Index(_native.Index):
    """An infgram (or infini-gram) index with its tokenizer: ``Index(path)`` opens a directory;
    ``Index(ask=..., shard_infos=..., separator=..., tokenizer=..., fingerprint=...)`` is the
    same class over shards held elsewhere (``infgram.ray``'s router makes one), which answers
    queries, the infini-gram API and ``generate``."""

    def query(self, request: Dict[str, Any]) -> Dict[str, Any]:
        """Answers one query of infgram's protocol, e.g. ``{"query_type": "count", "text": "the cat"}``;
        returns the answer, or ``{"error": ...}``."""
        return _json.loads(self.query_json(_json.dumps(request)))

    def infgram_rows(
        self,
        tokens: Any,
        *,
        window: int = 500,
        end_token: Optional[int] = None,
        vocab: Optional[int] = None,
        estimator: Union[None, str, Dict[str, Any]] = None,
        mixer: "Mixer" = None,
    ) -> "InfgramRows":
        """Every position's ∞-gram next-token distribution of ``tokens`` (a list, numpy array or
        CPU tensor of ids) in one call: row ``j`` is the distribution of the token after
        ``tokens[:j + 1]`` (it scores ``tokens[j + 1]``), from the longest suffix of the last
        ``window`` tokens that occurs with a next token. For mixing with a neural model, give its
        ``end_token`` (a document's end is reported as it) and ``vocab`` (its number of logits).
        ``estimator``: ``"infgram"`` (default: the paper's ∞-gram), ``{"name": "sbis", "k": 2}``,
        ``"smoothed"`` (dense rows); with ``mixer`` (a ``mix.json`` path or its dict, or
        ``"default"`` for the built-in one) and no ``estimator``, the mixer's."""
        np = _numpy()
        ids = np.ascontiguousarray(np.asarray(tokens).reshape(-1))
        if ids.size and (ids.dtype.kind not in "iu" or ids.min() < 0 or ids.max() > 0xFFFFFFFF):
            raise ValueError("tokens must be non-negative integer ids below 2**32")
        ids = ids.astype("<u4", copy=False)
        if estimator is None and mixer is not None:
            estimator = mixer_estimator(None if mixer == "default" else mixer)
        if isinstance(estimator, str):
            estimator = {"name": estimator}
        spec = None if estimator is None else _json.dumps(estimator)
        native = super().infgram_rows(ids.tobytes(), window, end_token, vocab, spec)
        return InfgramRows(native)


if hasattr(_native, "Model"):

    class Model(_native.Model):
        """A neural model run by infgram (``Model("smollm2-135m", index=..., past_outputs=...)``):
        ``generate(prompt, speculative=True, mix=True, guard=8, ...)`` returns the report of
        ``infgram gen --json``; as a ``step`` of :func:`infgram.speculative.generate`,
        ``model(new_ids)`` feeds tokens after its cache and returns their logits, and
        ``rollback(length)`` cuts the cache back."""

        def step(self, new_ids: Any) -> Any:
            """Feeds ``new_ids`` after the cache; returns a ``(len(new_ids), vocab_size)`` float32
            array of logits (row ``j`` scores the token after ``new_ids[j]``)."""
            ids = [int(t) for t in new_ids]
            raw = self.forward_bytes(ids)
            return _numpy().frombuffer(raw, dtype="<f4").reshape(len(ids), -1)

        __call__ = step

else:  # pragma: no cover - a wheel built without the `neural` feature

    class Model:  # type: ignore[no-redef]
        """Needs a wheel built with neural models (the default ``neural`` feature)."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise ImportError("this infgram wheel was built without neural models: rebuild it "
                              "with the default features (maturin build)")


def _numpy() -> Any:
    try:
        import numpy
    except ImportError as e:  # pragma: no cover - numpy is installed with the test extra
        raise ImportError("infgram's batch API returns numpy arrays: pip install numpy") from e
    return numpy


Mixer = Union[None, str, "_os.PathLike[str]", Dict[str, Any]]


def _mixer_json(mixer: Mixer) -> Optional[str]:
    """A mixer as JSON: None or ``"default"`` (the built-in one), a ``mix.json`` path, or its
    dict."""
    if mixer is None or mixer == "default":
        return None
    if isinstance(mixer, dict):
        return _json.dumps(mixer)
    with open(_os.fspath(mixer), encoding="utf-8") as f:
        return f.read()


def mixer_estimator(mixer: Mixer = None) -> Dict[str, Any]:
    """The estimator a mixer was fitted for (what ``infgram_rows`` must compute for it)."""
    text = _mixer_json(mixer)
    return _json.loads(_native.default_mixer() if text is None else text)["estimator"]


class InfgramRows:
    """The ∞-gram rows of a sequence (``Index.infgram_rows``), as numpy arrays: row ``j`` is
    ``ids[offsets[j]:offsets[j + 1]]`` with ``logprobs`` (natural log) alongside, sorted by id;
    ``suffix_len``, ``count`` and ``distinct`` per row (the longest suffix with a next token,
    its occurrences, its distinct continuations)."""

    def __init__(self, native: Any) -> None:
        np = _numpy()
        self._native = native
        raw = native.raw()
        self.offsets = np.frombuffer(raw["offsets"], dtype="<u8")
        self.ids = np.frombuffer(raw["ids"], dtype="<u4")
        self.logprobs = np.frombuffer(raw["logprobs"], dtype="<f4")
        self.suffix_len = np.frombuffer(raw["suffix_len"], dtype="<u4")
        self.count = np.frombuffer(raw["count"], dtype="<u8")
        self.distinct = np.frombuffer(raw["distinct"], dtype="<u4")
        self.vocab: int = native.vocab
        self.estimator: Dict[str, Any] = _json.loads(native.estimator)

    def __len__(self) -> int:
        return len(self.suffix_len)

    def row(self, j: int) -> Any:
        """Row ``j``: ``(ids, probabilities)``."""
        a, b = int(self.offsets[j]), int(self.offsets[j + 1])
        return self.ids[a:b], _numpy().exp(self.logprobs[a:b].astype("f8"))

    def dense(self) -> Any:
        """The rows as a dense ``(rows, vocab)`` float32 array of probabilities."""
        np = _numpy()
        out = np.zeros((len(self), self.vocab), dtype=np.float32)
        row_of = np.repeat(np.arange(len(self)), np.diff(self.offsets).astype(np.int64))
        out[row_of, self.ids] = np.exp(self.logprobs)
        return out

    def lambdas(self, mixer: Mixer = None) -> Any:
        """λ at every row by ``mixer`` (None: the built-in one; a ``mix.json`` path; its dict)."""
        return _numpy().frombuffer(self._native.lambdas(_mixer_json(mixer)), dtype="<f8")

    def mix(self, logits: Any, mixer: Mixer = None) -> Any:
        """The mixture ``ln(λ·P∞ + (1 − λ)·softmax(logits))`` at every row: ``logits`` is your
        model's ``(rows, vocab)`` array (numpy or a CPU tensor; any scale), the answer a float32
        array of log-probabilities of the same shape."""
        np = _numpy()
        x = np.ascontiguousarray(np.asarray(logits, dtype="<f4"))
        if x.ndim != 2 or x.shape[0] != len(self):
            raise ValueError(f"logits must have shape ({len(self)}, vocab), got {x.shape}")
        out = self._native.mix(x.tobytes(), _mixer_json(mixer))
        return np.frombuffer(out, dtype="<f4").reshape(x.shape)

    def mix_targets(self, targets: Any, neural_logprobs: Any, mixer: Mixer = None) -> Any:
        """The mixture's log-probability of each actual next token: ``targets[j]`` is the token
        row ``j`` scores (``tokens[1:]``), ``neural_logprobs[j]`` your model's normalized
        log-probability of it."""
        np = _numpy()
        t = np.ascontiguousarray(np.asarray(targets).reshape(-1)).astype("<u4")
        q = np.ascontiguousarray(np.asarray(neural_logprobs, dtype="<f4").reshape(-1))
        out = self._native.mix_targets(t.tobytes(), q.tobytes(), _mixer_json(mixer))
        return np.frombuffer(out, dtype="<f4")


from . import engine  # noqa: E402  (after Index: engine re-exports the native class)
