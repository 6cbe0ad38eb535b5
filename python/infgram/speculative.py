"""A reference speculative loop over any model, drafted by :class:`infgram.Drafter`.

``generate(step, prompt_ids, drafter)`` decodes with ``step``, a model that scores new tokens
against a cache it keeps and can roll back, and verifies the drafter's chains in one call per
pass:

* ``step(new_ids)`` feeds ``new_ids`` after the cache and returns one row of logits per new
  token (a ``(len(new_ids), vocab)`` array: row ``j`` scores the token after ``new_ids[j]``);
* ``step.rollback(length)`` (or the ``rollback`` argument) keeps the first ``length`` tokens
  of the cache.

Greedy decoding (``temperature=0``) gives exactly plain decoding's output; sampled decoding
draws each token from the model's distribution exactly (the standard rejection rule, with the
drafter's chain as a point mass). This is the loop an engine's speculative hook runs; the
engine's own is faster, the drafts are the same.
"""

from typing import Callable, Iterable, List, Optional, Sequence

__all__ = ["generate"]


def _softmax(row, temperature):
    import numpy as np

    z = np.asarray(row, dtype=np.float64) / temperature
    z = np.exp(z - z.max())
    return z / z.sum()


def generate(
    step: Callable,
    prompt_ids: Sequence[int],
    drafter=None,
    *,
    max_tokens: int = 128,
    draft_tokens: int = 16,
    temperature: float = 0.0,
    seed: Optional[int] = None,
    eos_ids: Iterable[int] = (),
    rollback: Optional[Callable[[int], None]] = None,
    request_id: str = "generate",
    stats: Optional[dict] = None,
) -> List[int]:
    """Generates up to ``max_tokens`` tokens after ``prompt_ids``; returns them.

    ``drafter``: an :class:`infgram.Drafter` (``None``: plain decoding, one token a pass).
    ``stats``: a dict that receives ``passes``, ``drafted`` and ``accepted``.
    """
    import numpy as np

    if not prompt_ids:
        raise ValueError("generate needs a non-empty prompt")
    if rollback is None:
        rollback = getattr(step, "rollback", None)
    if drafter is not None and rollback is None:
        raise ValueError("speculative decoding rolls the cache back: give step.rollback or rollback=")
    rng = np.random.default_rng(seed)
    eos = set(eos_ids)
    prompt = list(prompt_ids)
    if len(prompt) > 1:
        step(prompt[:-1])
    cached = len(prompt) - 1
    pending = prompt[-1]
    if drafter is not None:
        drafter.start(request_id, prompt)
    out: List[int] = []
    counts = {"passes": 0, "drafted": 0, "accepted": 0}

    def choose(row, avoid=None):
        if temperature == 0:
            if avoid is not None:
                row = np.array(row, dtype=np.float64)
                row[avoid] = -np.inf
            return int(np.argmax(row))
        p = _softmax(row, temperature)
        if avoid is not None:
            p[avoid] = 0.0
            p = p / p.sum()
        return int(rng.choice(len(p), p=p))

    try:
        while len(out) < max_tokens:
            room = max_tokens - len(out) - 1
            draft: List[int] = []
            if drafter is not None and room > 0:
                draft = list(drafter.draft(request_id, min(draft_tokens, room)).token_ids)
            rows = np.asarray(step([pending] + draft))
            counts["passes"] += 1
            counts["drafted"] += len(draft)
            emitted: List[int] = []
            for j, t in enumerate(draft):
                if temperature == 0:
                    if choose(rows[j]) != t:
                        break
                else:
                    # A point-mass draft: accept t with the model's probability of t, else
                    # draw from the model's distribution without t.
                    p = _softmax(rows[j], temperature)
                    if rng.random() >= p[t]:
                        break
                emitted.append(t)
            accepted = len(emitted)
            counts["accepted"] += accepted
            rejected = draft[accepted] if accepted < len(draft) else None
            nxt = choose(rows[accepted], avoid=rejected if temperature != 0 else None)
            emitted.append(nxt)
            # The cache keeps the pending token and the accepted drafts.
            if draft:
                rollback(cached + 1 + accepted)
            cached += 1 + accepted
            for i, t in enumerate(emitted):
                if len(out) >= max_tokens:
                    emitted = emitted[:i]
                    break
                out.append(t)
                if t in eos:
                    emitted = emitted[: i + 1]
                    break
            if drafter is not None:
                drafter.extend(request_id, emitted)
            if (out and out[-1] in eos) or len(out) >= max_tokens:
                break
            pending = out[-1]
    finally:
        if drafter is not None:
            try:
                drafter.finish(request_id)
            except KeyError:
                pass
    if stats is not None:
        stats.update(counts)
    return out
