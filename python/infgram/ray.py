"""Past one machine: build and serve a sharded infgram index on a Ray cluster.

* ``build(inputs, out, shards=N, tokenizer=...)`` cuts the inputs into N slices of whole
  documents with about the same bytes (``plan_slices``: a text file is a document, a JSON-lines
  file is split at its lines), builds each slice with infgram's own builder as a Ray task, and
  writes ``out/manifest.json``: each slice's directory, the node that built it, its documents,
  its shards, the tokenizer's fingerprint and the header checksum. Documents are numbered in
  input order across slices, so ``get_doc_by_ix`` means what it means on one index. A slice
  that fails leaves nothing behind and names its file; the slices that were built are kept,
  and a rerun builds only the missing ones.
* ``Engine(manifest, eos_token_id)`` has the methods and answers of
  ``infgram.engine.InfiniGramEngine``. One Ray actor per slice (placed on the node that built
  it) answers the per-shard questions; the merge is the Rust library's own code
  (``InfiniGramEngine.over_shards``), including the two rounds of the ∞-gram queries and
  document fetches routed to their shard.
* ``Router(manifest).index()`` answers infgram's query protocol (``query_json``), generates
  with SBIS and the copy guard (``generate``: each token one round trip; the same text as on
  one index for the same seed) and answers the infini-gram HTTP API (``api``) over the same
  actors; ``serve_app(manifest)`` is a Ray Serve deployment of that API, with the request and
  response shapes and limits of ``infgram serve``.

Faults: a shard actor that dies is restarted by Ray (``max_restarts``) and the question is asked
again, up to ``retries`` times; past that the query fails with an error naming the slice and
its node, never a partial count. A manifest whose slice has another tokenizer, or whose header
checksum differs from the files, is refused when the engine starts.

Cost: a query costs one round trip to every slice's actor (two for the ∞-gram queries and a CNF
search, one to a single actor for a document fetch; a generated token one, and the copy guard
at most two more); the slices are asked in parallel.
"""

import json
import os
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import _native

__all__ = ["build", "Engine", "Router", "serve_app", "load_manifest", "MANIFEST"]

MANIFEST = "manifest.json"
FORMAT = "infgram-ray-manifest"
VERSION = 1


def _ray():
    try:
        import ray
    except ImportError as e:  # pragma: no cover - the tests install ray
        raise ImportError("infgram.ray needs Ray: pip install 'ray[serve]'") from e
    if not ray.is_initialized():
        raise RuntimeError(
            "Ray is not initialized: call ray.init() (or ray.init(address=...)) first"
        )
    return ray


def _slice_dir(i: int) -> str:
    return f"slice-{i:04d}"


def _build_slice(inputs: List[str], out: str, docs: Tuple[int, int], tokenizer: str,
                 reverse: bool, mem_gb: Optional[float]) -> Dict[str, Any]:
    """One slice's build (runs as a Ray task): infgram's builder over documents ``docs``."""
    import ray

    summary = _native.build_index(inputs, out, tokenizer=tokenizer, mem_gb=mem_gb,
                                  reverse=reverse, progress=False, docs=docs)
    identity = _native.Index(out).identity()
    context = ray.get_runtime_context()
    return {
        "node_id": context.get_node_id(),
        "node_ip": ray.util.get_node_ip_address(),
        "summary": summary,
        **identity,
    }


def build(inputs: Sequence[str], out: str, shards: int, tokenizer: str = "bytes",
          reverse: bool = True, mem_gb: Optional[float] = None, cpus_per_slice: float = 1,
          max_retries: int = 2, overwrite: bool = False) -> Dict[str, Any]:
    """Builds ``inputs`` (files or directories of .txt / .jsonl[.gz|.zst]) as ``shards`` slices
    on the Ray cluster into ``out`` (a directory every node can write: shared storage, or the
    same path on each node's disk), and returns the manifest (also written to
    ``out/manifest.json``). ``cpus_per_slice``: the cores a slice's task takes (give a node's
    worth on a real cluster); ``max_retries``: rebuilds of a slice whose node or worker died.
    A rerun keeps the slices already built; ``overwrite`` starts over."""
    ray = _ray()
    if tokenizer == "words":
        raise ValueError(
            "the words tokenizer takes its vocabulary from the whole corpus: build a word-level "
            "index with one `infgram index --tokenizer words`")
    inputs = [os.path.abspath(p) for p in inputs]
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    plan_path = os.path.join(out, "plan.json")
    asked = {"inputs": inputs, "tokenizer": tokenizer, "shards": shards}
    if overwrite:
        _remove_slices(out)
    if os.path.exists(plan_path):
        # A rerun: the slices keep the documents they were planned with.
        with open(plan_path) as f:
            recorded = json.load(f)
        if {k: recorded.get(k) for k in asked} != asked:
            raise ValueError(
                f"{out} holds a build of other inputs, tokenizer or slices: pass "
                "overwrite=True to start over, or another directory")
        plan = recorded["slices"]
    else:
        plan = [list(s) for s in _native.plan_slices(inputs, shards)]
        if not plan:
            raise ValueError("no documents in the inputs: pass .txt or .jsonl files or "
                             "directories")
        _write_json(plan_path, {**asked, "slices": plan})

    task = ray.remote(num_cpus=cpus_per_slice, max_retries=max_retries,
                      retry_exceptions=False)(_build_slice)
    done: Dict[int, Dict[str, Any]] = {}
    pending = {}
    for i, (first, end, _) in enumerate(plan):
        d = os.path.join(out, _slice_dir(i))
        built = _built_slice(d, first, end)
        if built is not None:
            done[i] = built
        else:
            pending[task.remote(inputs, d, (first, end), tokenizer, reverse, mem_gb)] = i
    failures = []
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        i = pending.pop(ready[0])
        try:
            result = ray.get(ready[0])
        except Exception as e:  # a RayTaskError carries the builder's message
            failures.append((i, _cause(e)))
            continue
        result["docs"] = plan[i][:2]
        _write_json(os.path.join(out, _slice_dir(i) + ".json"), result)
        done[i] = result
    if failures:
        lines = "; ".join(f"slice {i} (documents {plan[i][0]}..{plan[i][1]}): {msg}"
                          for i, msg in sorted(failures))
        raise RuntimeError(
            f"{len(failures)} of {len(plan)} slices failed: {lines}. The {len(done)} built "
            "slices are kept: fix the input and run build again to finish")
    manifest = _manifest(out, tokenizer, [done[i] for i in range(len(plan))])
    _write_json(os.path.join(out, MANIFEST), manifest)
    return manifest


def _cause(e: Exception) -> str:
    """The builder's own message inside a Ray task error."""
    cause = getattr(e, "cause", None)
    return str(cause) if cause is not None else str(e).strip().splitlines()[-1]


def _built_slice(d: str, first: int, end: int) -> Optional[Dict[str, Any]]:
    """The record of slice directory ``d`` if it was built (and still opens), else None."""
    record = d + ".json"
    if not (os.path.isdir(d) and os.path.exists(record)):
        return None
    with open(record) as f:
        r = json.load(f)
    if r.get("docs") != [first, end]:
        return None
    try:
        if _native.Index(d).identity()["header_crc32"] != r["header_crc32"]:
            return None
    except (ValueError, OSError):
        return None
    return r


def _remove_slices(out: str) -> None:
    import shutil

    for name in os.listdir(out):
        p = os.path.join(out, name)
        if name.startswith("slice-") and os.path.isdir(p):
            shutil.rmtree(p)
        elif name.startswith("slice-") or name in (MANIFEST, "plan.json"):
            os.remove(p)


def _write_json(path: str, value: Any) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _manifest(out: str, tokenizer: str, slices: List[Dict[str, Any]]) -> Dict[str, Any]:
    first = slices[0]
    for i, s in enumerate(slices):
        if s["tokenizer"] != first["tokenizer"] or s["separator"] != first["separator"]:
            raise ValueError(f"slice {i} was built with another tokenizer than slice 0")
    return {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer": {"name": tokenizer, **first["tokenizer"]},
        "separator": first["separator"],
        "token_width": first["token_width"],
        "documents": sum(s["docs"][1] - s["docs"][0] for s in slices),
        "slices": [{
            "dir": os.path.join(out, _slice_dir(i)),
            "node_id": s["node_id"],
            "node_ip": s["node_ip"],
            "docs": s["docs"],
            "header_crc32": s["header_crc32"],
            "fingerprint": s["tokenizer"]["fingerprint"],
            "shard_infos": s["shard_infos"],
        } for i, s in enumerate(slices)],
    }


def load_manifest(manifest: Any) -> Dict[str, Any]:
    """A manifest: a dict, a manifest.json path, or the build directory holding one."""
    if isinstance(manifest, dict):
        m = manifest
    else:
        path = os.fspath(manifest)
        if os.path.isdir(path):
            path = os.path.join(path, MANIFEST)
        with open(path) as f:
            m = json.load(f)
    if m.get("format") != FORMAT or m.get("version") != VERSION:
        raise ValueError(f"not an infgram Ray manifest of version {VERSION}")
    fp = m["tokenizer"]["fingerprint"]
    for i, s in enumerate(m["slices"]):
        if s["fingerprint"] != fp:
            raise ValueError(
                f"slice {i} ({s['dir']}) was built with another tokenizer (fingerprint "
                f"{s['fingerprint']}, the manifest's is {fp}): rebuild it")
    return m


class _ShardServer:
    """A Ray actor serving one slice: opens it, checks it against the manifest, and answers the
    per-shard questions (the GIL is released while Rust answers)."""

    def __init__(self, path: str, header_crc32: int, fingerprint: str):
        self.index = _native.Index(path)
        ident = self.index.identity()
        if ident["tokenizer"]["fingerprint"] != fingerprint:
            raise ValueError(
                f"{path}: built with tokenizer fingerprint {ident['tokenizer']['fingerprint']}, "
                f"the manifest says {fingerprint}: rebuild the slice or fix the manifest")
        if ident["header_crc32"] != header_crc32:
            raise ValueError(
                f"{path}: header checksum {ident['header_crc32']}, the manifest says "
                f"{header_crc32}: the slice was rebuilt or changed since; rebuild the manifest")
        self.pid = os.getpid()

    def ready(self) -> int:
        return self.pid

    def answer(self, requests: List[Tuple[int, str]]) -> List[str]:
        return self.index.answer_shard_queries(requests)


class Router:
    """One actor per slice of a manifest, and the ``ask`` the Rust merges call: each question to
    the actor holding its shard, the slices in parallel, a dead actor's question asked again
    after Ray restarts it (``retries`` times, ``backoff_s`` apart, each ``timeout_s`` at most)."""

    def __init__(self, manifest: Any, retries: int = 3, timeout_s: float = 30.0,
                 backoff_s: float = 0.5):
        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.manifest = load_manifest(manifest)
        self.retries, self.timeout_s, self.backoff_s = retries, timeout_s, backoff_s
        self.slices = self.manifest["slices"]
        # Global shard number -> (slice, shard within the slice).
        self.owner = [(i, j) for i, s in enumerate(self.slices)
                      for j in range(len(s["shard_infos"]))]
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        server = ray.remote(num_cpus=0, max_restarts=max(retries, 1),
                            max_task_retries=0)(_ShardServer)
        self.actors = []
        for s in self.slices:
            # On the node that built it (its files may be on that node's disk only); anywhere
            # the files are when that node is gone (shared storage).
            strategy = (NodeAffinitySchedulingStrategy(s["node_id"], soft=True)
                        if s["node_id"] in alive else "DEFAULT")
            self.actors.append(server.options(scheduling_strategy=strategy).remote(
                s["dir"], s["header_crc32"], s["fingerprint"]))
        try:
            ray.get([a.ready.remote() for a in self.actors], timeout=max(timeout_s, 60))
        except Exception as e:
            self.shutdown()
            raise ValueError(f"a slice was refused at start: {_cause(e)}") from None

    @property
    def shard_infos(self) -> List[Tuple[int, int]]:
        return [tuple(x) for s in self.slices for x in s["shard_infos"]]

    def ask(self, requests: List[Tuple[int, str]]) -> List[str]:
        """Answers ``[(shard, query_json), ...]`` in order (called by the Rust merges)."""
        ray = _ray()
        by_slice: Dict[int, List[int]] = {}
        for k, (shard, _) in enumerate(requests):
            if not 0 <= shard < len(self.owner):
                raise ValueError(f"shard {shard} does not exist ({len(self.owner)} shards)")
            by_slice.setdefault(self.owner[shard][0], []).append(k)
        batches = {i: [(self.owner[requests[k][0]][1], requests[k][1]) for k in ks]
                   for i, ks in by_slice.items()}
        refs = {i: self.actors[i].answer.remote(b) for i, b in batches.items()}
        out: List[Optional[str]] = [None] * len(requests)
        for i, ks in by_slice.items():
            for k, a in zip(ks, self._collect(ray, i, refs[i], batches[i])):
                out[k] = a
        return out

    def _collect(self, ray, i: int, ref, batch) -> List[str]:
        """The answers of slice ``i`` to ``batch``, asking again while its actor restarts."""
        from ray.exceptions import GetTimeoutError, RayActorError

        transient = (RayActorError, GetTimeoutError)
        try:
            unavailable = (ray.exceptions.ActorUnavailableError,)
        except AttributeError:  # older Ray
            unavailable = ()
        last: Exception = RuntimeError("no answer")
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff_s * attempt)
                ref = self.actors[i].answer.remote(batch)
            try:
                return ray.get(ref, timeout=self.timeout_s)
            except transient + unavailable as e:
                last = e
        s = self.slices[i]
        raise RuntimeError(
            f"slice {i} ({s['dir']} on node {s['node_ip']}) did not answer after "
            f"{self.retries + 1} tries: {type(last).__name__}: {_cause(last)}")

    def engine(self, eos_token_id: int, **kwargs) -> "_native.InfiniGramEngine":
        """An ``InfiniGramEngine`` over these actors (``kwargs``: its constructor's)."""
        m = self.manifest
        return _native.InfiniGramEngine.over_shards(
            self.ask, self.shard_infos, m["separator"], m["tokenizer"]["vocab_size"],
            eos_token_id, token_dtype=f"u{8 * m['token_width']}", **kwargs)

    def index(self, tokenizer: Optional[str] = None,
              name: str = "index") -> "Index":
        """An ``infgram.Index`` over these actors: infgram's protocol (``query``), SBIS
        generation (``generate``), the infini-gram HTTP API (``api``) and drafting
        (``infgram.Drafter(index=...)``), with the build's
        tokenizer (or ``tokenizer``, of the same fingerprint)."""
        from . import Index

        m = self.manifest
        return Index(ask=self.ask, shard_infos=self.shard_infos, separator=m["separator"],
                     tokenizer=tokenizer or m["tokenizer"]["name"],
                     fingerprint=m["tokenizer"]["fingerprint"], name=name)

    def shutdown(self) -> None:
        """Stops the slice actors."""
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:
                pass
        self.actors = []


class Engine:
    """``infgram.engine.InfiniGramEngine`` over a sharded index on a Ray cluster: the same
    methods, keyword arguments and answers (``get_num_shards`` counts the shards of every
    slice). ``retries``, ``timeout_s``: the router's; other keyword arguments are the engine's
    (``max_support``, ``maxnum``, …)."""

    def __init__(self, manifest: Any, eos_token_id: int, retries: int = 3,
                 timeout_s: float = 30.0, **kwargs):
        self.router = Router(manifest, retries=retries, timeout_s=timeout_s)
        try:
            self._engine = self.router.engine(eos_token_id, **kwargs)
        except Exception:
            self.router.shutdown()
            raise

    def __getattr__(self, name: str) -> Callable:
        return getattr(self._engine, name)

    def shutdown(self) -> None:
        """Stops the slice actors."""
        self.router.shutdown()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def serve_app(manifest: Any, tokenizer: Optional[str] = None, name: str = "index",
              retries: int = 3, timeout_s: float = 30.0):
    """A Ray Serve application answering the infini-gram HTTP API (``POST /``) as
    ``infgram serve`` does, over a sharded index: ``serve.run(serve_app(m), route_prefix="/")``
    after ``serve.start(http_options={"host": ..., "port": ...})``."""
    from ray import serve
    from starlette.requests import Request
    from starlette.responses import Response

    @serve.deployment(ray_actor_options={"num_cpus": 0})
    class InfgramAPI:
        def __init__(self, manifest, tokenizer, name, retries, timeout_s):
            self.router = Router(manifest, retries=retries, timeout_s=timeout_s)
            self.index = self.router.index(tokenizer, name)

        async def __call__(self, request: Request) -> Response:
            import asyncio

            if request.method != "POST":
                body = json.dumps({"error": "POST a JSON query to /"})
                return Response(body, status_code=405, media_type="application/json")
            data = await request.body()
            status, text = await asyncio.get_running_loop().run_in_executor(
                None, self.index.api, data)
            return Response(text, status_code=status, media_type="application/json")

    return InfgramAPI.bind(load_manifest(manifest), tokenizer, name, retries, timeout_s)
