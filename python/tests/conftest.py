"""Shared helpers: random corpora, indexes built by infini-gram's own indexer, by infgram, and
the engines over them."""

import json
import os
import random
import resource
import subprocess
import sys
from pathlib import Path

import pytest

DTYPES = {"u8": 1, "u16": 2}


def random_corpus(seed, dtype, n_docs=None):
    """Documents of skewed random ids (so n-grams repeat). u16 ids include ones whose two bytes
    sort differently from their values (256 < 1 by bytes)."""
    rng = random.Random(seed)
    if dtype == "u8":
        alphabet = [97, 98, 99, 32, 0, 1, 254] + list(range(100, 110))
    else:
        alphabet = [1, 256, 257, 2, 513, 1000, 65534, 0, 7] + [rng.randrange(65535) for _ in range(5)]
    weights = [8, 6, 4, 3, 2, 2, 1] + [1] * (len(alphabet) - 7)
    n_docs = n_docs or rng.randint(1, 8)
    return [rng.choices(alphabet, weights, k=rng.randint(0, 60)) for _ in range(n_docs)]


def queries(seed, docs, n=40):
    """Queries cut from the corpus (prefixes, suffixes, middles) and random ones."""
    rng = random.Random(seed + 1)
    pool = sorted({t for d in docs for t in d}) or [1]
    out = [[]]
    for _ in range(n):
        d = rng.choice(docs)
        if d and rng.random() < 0.7:
            i = rng.randrange(len(d))
            j = rng.choice([len(d), min(len(d), i + rng.randint(1, 6))])
            out.append(d[i:j])
        else:
            out.append([rng.choice(pool + [3, 4]) for _ in range(rng.randint(1, 4))])
    return out


def write_tokenized(save_dir, docs, dtype, shards):
    """Step 1 of infini-gram's indexer, as its `tokenize` writes it: per shard (documents taken
    round-robin) the tokens, each document after a separator, its byte offsets, and metadata."""
    w = DTYPES[dtype]
    save_dir.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        tok, off, meta, metaoff = bytearray(), bytearray(), bytearray(), bytearray()
        for i, d in enumerate(docs):
            if i % shards != s:
                continue
            off += len(tok).to_bytes(8, "little")
            tok += b"\xff" * w + b"".join(t.to_bytes(w, "little") for t in d)
            metaoff += len(meta).to_bytes(8, "little")
            meta += (json.dumps({"path": "c.jsonl", "linenum": i, "metadata": {"i": i}}) + "\n").encode()
        for name, data in [("tokenized", tok), ("offset", off), ("metadata", meta), ("metaoff", metaoff)]:
            (save_dir / f"{name}.{s}").write_bytes(bytes(data))


def infini_gram_index(save_dir, docs, dtype, shards=1):
    """An index written by infini-gram's own indexer (its suffix-array step over our tokens)."""
    write_tokenized(save_dir, docs, dtype, shards)
    empty = save_dir.parent / (save_dir.name + "-data")
    empty.mkdir(exist_ok=True)
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    cmd = [sys.executable, "-m", "infini_gram.indexing", "--data_dir", str(empty), "--save_dir", str(save_dir),
           "--token_dtype", dtype, "--cpus", "1", "--mem", "1", "--shards", str(shards), "--ulimit", str(nofile)]
    subprocess.run(cmd, check=True, capture_output=True)
    return save_dir


def infgram_index(out, docs, dtype, docs_per_shard=None):
    """The same documents indexed by infgram (by ids)."""
    import infgram

    vocab = 255 if dtype == "u8" else 65535
    meta = [json.dumps({"path": "c.jsonl", "linenum": i, "metadata": {"i": i}}) for i in range(len(docs))]
    infgram.build_index_from_ids(docs, str(out), vocab, metadata=meta, docs_per_shard=docs_per_shard)
    return out


@pytest.fixture
def engines():
    """Engines over one directory: (infini-gram's, infgram's)."""
    from infini_gram.engine import InfiniGramEngine as Theirs
    from infgram.engine import InfiniGramEngine as Ours

    def make(index_dir, dtype, eos=0, **kw):
        vocab = 255 if dtype == "u8" else 65535
        args = dict(index_dir=str(index_dir), eos_token_id=eos, vocab_size=vocab, token_dtype=dtype, **kw)
        return Theirs(**args), Ours(**args)

    return make


def infgram_binary():
    """The `infgram` command built by `cargo test --release` (or `cargo build --release`) in
    this checkout; `INFGRAM_BIN` names another. Skips the test where there is none."""
    path = Path(os.environ.get("INFGRAM_BIN", Path(__file__).resolve().parents[2] / "target" / "release" / "infgram"))
    if not path.exists():
        pytest.skip(f"no infgram binary at {path}: run `cargo build --release` first")
    return str(path)


class served:
    """`infgram serve --addr 127.0.0.1:0 ARGS` for a `with` block: `.addr` is where it listens;
    the server is stopped when the block ends."""

    def __init__(self, *args):
        self.args = args

    def __enter__(self):
        self.proc = subprocess.Popen([infgram_binary(), "serve", "--addr", "127.0.0.1:0", "--quiet", *self.args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.addr = None
        for _ in range(200):
            line = self.proc.stderr.readline()
            if line.startswith("listening on http://"):
                self.addr = line.split("http://", 1)[1].split()[0]
                break
            if not line and self.proc.poll() is not None:
                break
        if not (self.addr and self.addr.startswith("127.0.0.1:")):
            self.__exit__()
            raise AssertionError("the server did not start")
        return self

    def post(self, path, body):
        """POSTs `body` (JSON) and returns the decoded answer."""
        import urllib.request

        request = urllib.request.Request(f"http://{self.addr}{path}", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=30)
