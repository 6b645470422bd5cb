"""Corpus sources, chunking and the restartable sampler."""

from __future__ import annotations

import gzip
import itertools
import json
import random
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from spade_async.core.config.corpus import CorpusConfig, HFSourceConfig
from spade_async.corpus import stdlib
from spade_async.corpus.chunking import chunk_document, chunk_text
from spade_async.corpus.documents import (
    Chunk,
    CorpusError,
    CorpusSource,
    CorpusStateError,
    Document,
)
from spade_async.corpus.files import JsonlSource, ParquetSource, TextDirSource
from spade_async.corpus.hf import HFDatasetSource
from spade_async.corpus.sampler import CorpusSampler
from spade_async.corpus.sources import make_source
from spade_async.corpus.stdlib import StdlibDocs


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron".split()


def sentence(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words)).capitalize() + rng.choice(".!?")


def paragraph(rng: random.Random, n_sentences: int) -> str:
    return " ".join(sentence(rng, rng.randint(3, 15)) for _ in range(n_sentences))


class ListSource(CorpusSource):
    def __init__(self, docs: list[Document], name: str = "list") -> None:
        self.docs = docs
        self._name = name
        self.reads = 0

    @property
    def name(self) -> str:
        return self._name

    def iter_documents(self):
        self.reads += 1
        yield from self.docs


def make_docs(n: int, seed: int = 0) -> list[Document]:
    rng = random.Random(seed)
    return [
        Document(
            id=f"d{i}", source="list", title=f"Doc {i}",
            text="\n\n".join(paragraph(rng, rng.randint(1, 6)) for _ in range(rng.randint(1, 8))),
        )
        for i in range(n)
    ]


# -- chunking -------------------------------------------------------------------------------


def test_chunks_pack_paragraphs_and_keep_every_word_in_order():
    rng = random.Random(1)
    for _ in range(50):
        text = "\n\n".join(paragraph(rng, rng.randint(1, 20)) for _ in range(rng.randint(1, 12)))
        max_chars = rng.choice([100, 300, 800, 2000])
        chunks = chunk_text(text, max_chars=max_chars, min_chars=0)
        assert all(0 < len(c) <= max_chars for c in chunks)
        assert " ".join(chunks).split() == text.split()


def test_paragraph_boundaries_are_preferred():
    paras = [f"Paragraph {i}. " + "word " * 30 for i in range(6)]
    text = "\n\n".join(p.strip() for p in paras)
    chunks = chunk_text(text, max_chars=400, min_chars=0)
    assert len(chunks) == 3
    for c in chunks:  # each chunk holds whole paragraphs
        assert all(part.startswith("Paragraph ") for part in c.split("\n\n"))
    # the separators inside a chunk are the text's own
    assert "\n\n".join(chunks) == text


def test_long_paragraph_falls_back_to_sentences_then_whitespace_then_hard_cuts():
    long_para = " ".join(f"Sentence number {i} has some words in it." for i in range(40))
    chunks = chunk_text(long_para, max_chars=200, min_chars=0)
    assert len(chunks) > 1 and all(len(c) <= 200 and c.endswith(".") for c in chunks)

    no_stops = " ".join(f"word{i}" for i in range(200))
    chunks = chunk_text(no_stops, max_chars=100, min_chars=0)
    assert all(len(c) <= 100 for c in chunks)
    assert " ".join(chunks).split() == no_stops.split()  # cut between words only

    giant = "x" * 450
    assert chunk_text(giant, max_chars=100, min_chars=0) == ["x" * 100] * 4 + ["x" * 50]


def test_short_chunks_are_dropped_and_bad_sizes_refused():
    text = "A" * 500 + "\n\n" + "tail."
    assert chunk_text(text, max_chars=500, min_chars=10) == ["A" * 500]
    assert chunk_text("   \n\n  ", min_chars=0) == []
    with pytest.raises(ValueError, match="min_chars"):
        chunk_text("x", max_chars=10, min_chars=11)
    with pytest.raises(ValueError, match="max_chars"):
        chunk_text("x", max_chars=0, min_chars=0)


def test_chunk_ids_number_the_kept_chunks():
    doc = Document("doc-7", "s", "Seven", "\n\n".join(["p" * 150] * 3))
    chunks = chunk_document(doc, max_chars=200, min_chars=100)
    assert chunks == [Chunk("doc-7", f"doc-7#{i}", "p" * 150, "Seven") for i in range(3)]


# -- file sources -----------------------------------------------------------------------------


def test_jsonl_source(tmp_path):
    rows = [
        {"text": "first text", "id": 10, "title": "One"},
        {"text": None, "id": 11, "title": "null text is skipped"},
        {"text": "third text", "id": 12, "title": "Three"},
    ]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + json.dumps(rows[2]) + "\n")
    docs = list(JsonlSource(path).iter_documents())
    assert [(d.id, d.title, d.text) for d in docs] == [
        ("docs.jsonl:1", "docs.jsonl:1", "first text"),
        ("docs.jsonl:4", "docs.jsonl:4", "third text"),
    ]
    src = JsonlSource(path, id_field="id", title_field="title")
    assert [(d.id, d.title) for d in src.iter_documents()] == [("10", "One"), ("12", "Three")]
    assert all(d.source == src.name for d in src.iter_documents())

    gz = tmp_path / "docs.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"body": "zipped"}) + "\n")
    assert [d.text for d in JsonlSource(gz, text_field="body").iter_documents()] == ["zipped"]


@pytest.mark.parametrize(
    ("content", "kwargs", "message"),
    [
        ('{"text": "ok"}\n{"txt": "typo"}\n', {}, r"docs.jsonl:2: no field 'text'"),
        ('{"text": "ok"}\n{not json\n', {}, r"docs.jsonl:2: not valid JSON"),
        ('[1, 2]\n', {}, r"docs.jsonl:1: a line must hold a JSON object"),
        ('{"text": 5}\n', {}, r"docs.jsonl:1: field 'text' is int"),
        ('{"text": "ok"}\n', {"id_field": "uid"}, r"docs.jsonl:1: no field 'uid'"),
    ],
)
def test_jsonl_errors_name_line_and_field(tmp_path, content, kwargs, message):
    path = tmp_path / "docs.jsonl"
    path.write_text(content)
    with pytest.raises(CorpusError, match=message):
        list(JsonlSource(path, **kwargs).iter_documents())


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        list(JsonlSource(tmp_path / "nope.jsonl").iter_documents())


def test_parquet_source_streams_batches_over_files(tmp_path):
    (tmp_path / "part").mkdir()
    for k in range(2):
        texts = [f"text {k}-{i}" if i != 3 else None for i in range(7)]
        table = pa.table({
            "content": texts, "uid": [f"u{k}{i}" for i in range(7)], "t": [f"T{i}" for i in range(7)],
            "other": list(range(7)),
        })
        pq.write_table(table, tmp_path / "part" / f"{k}.parquet", row_group_size=3)
    (tmp_path / "part" / "notes.txt").write_text("not parquet")

    src = ParquetSource(tmp_path / "part", text_column="content", batch_size=2)
    docs = list(src.iter_documents())
    assert [d.text for d in docs] == [f"text {k}-{i}" for k in range(2) for i in range(7) if i != 3]
    assert docs[3].id == "0.parquet:4" and docs[-1].id == "1.parquet:6"
    assert docs[0].source == src.name

    src = ParquetSource(tmp_path / "part" / "1.parquet", "content", id_column="uid", title_column="t")
    assert [(d.id, d.title) for d in src.iter_documents()][:2] == [("u10", "T0"), ("u11", "T1")]

    with pytest.raises(CorpusError, match=r"no column 'body' \(columns: \['content', 'other'"):
        list(ParquetSource(tmp_path / "part", "body").iter_documents())
    with pytest.raises(CorpusError, match="column 'other' is not text"):
        list(ParquetSource(tmp_path / "part", "other").iter_documents())
    with pytest.raises(CorpusError, match="no Parquet file"):
        list(ParquetSource(tmp_path / "missing", "content").iter_documents())


def test_text_dir_source(tmp_path):
    (tmp_path / "b" / "deep").mkdir(parents=True)
    (tmp_path / ".git").mkdir()
    (tmp_path / "a.txt").write_text("plain text")
    (tmp_path / "b" / "guide.md").write_text("intro line\n\n# The Guide #\n\nbody")
    (tmp_path / "b" / "deep" / "z.txt").write_text("deep text")
    (tmp_path / "b" / "image.png").write_bytes(b"\x89PNG")
    (tmp_path / ".git" / "notes.txt").write_text("hidden")
    (tmp_path / ".hidden.md").write_text("hidden")

    src = TextDirSource(tmp_path)
    docs = list(src.iter_documents())
    assert [(d.id, d.title) for d in docs] == [
        ("a.txt", "a"), ("b/deep/z.txt", "z"), ("b/guide.md", "The Guide"),
    ]
    assert docs[0].text == "plain text"
    assert [d.id for d in TextDirSource(tmp_path, glob="*.txt").iter_documents()] == ["a.txt"]
    assert TextDirSource(tmp_path, "*.md|**/*.txt").name != src.name
    with pytest.raises(CorpusError, match="not found"):
        list(TextDirSource(tmp_path / "nope").iter_documents())


# -- Hugging Face datasets ----------------------------------------------------------------


def test_hf_source_without_datasets_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(CorpusError, match=r"needs the `datasets` package: pip install datasets"):
        list(HFDatasetSource("org/corpus", "train", "text").iter_documents())


def test_hf_source_streams_through_load_dataset(monkeypatch):
    calls = []

    def load_dataset(path, **kwargs):
        calls.append((path, kwargs))
        return iter([{"text": "one", "id": "a"}, {"text": None, "id": "b"}, {"text": "three", "id": "c"}])

    fake = types.ModuleType("datasets")
    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)

    src = HFDatasetSource("org/corpus", "validation", "text", "en", revision="abc123")
    docs = list(src.iter_documents())
    assert calls == [("org/corpus", {"split": "validation", "streaming": True, "name": "en",
                                     "revision": "abc123"})]
    assert [(d.id, d.text) for d in docs] == [("org/corpus:validation:0", "one"),
                                              ("org/corpus:validation:2", "three")]
    assert src.name == "hf:org/corpus:en:validation:abc123:text"

    docs = list(HFDatasetSource("org/corpus", "train", "text", id_field="id").iter_documents())
    assert [d.id for d in docs] == ["a", "c"] and calls[-1][1] == {"split": "train", "streaming": True}
    with pytest.raises(CorpusError, match=r"org/corpus\[train\] row 0: no field 'body'"):
        list(HFDatasetSource("org/corpus", "train", "body").iter_documents())


# -- standard-library docstrings ------------------------------------------------------------


@pytest.fixture(scope="module")
def stdlib_docs() -> list[Document]:
    return list(StdlibDocs().iter_documents())


def test_stdlib_docs_are_substantial_deterministic_and_safe(stdlib_docs):
    ids = [d.id for d in stdlib_docs]
    assert len(ids) == len(set(ids)) > 100
    assert all(len(d.text) >= 300 and d.source.startswith("stdlib:py3.") for d in stdlib_docs)
    for wanted in ("stdlib:json", "stdlib:collections.abc", "stdlib:asyncio.tasks", "stdlib:aifc"):
        assert wanted in ids
    names = {d.title for d in stdlib_docs}
    for denied in ("antigravity", "this", "tkinter", "turtle", "idlelib", "test.support",
                   "unittest.test", "encodings.cp1252", "json.__main__", "_pydecimal"):
        assert denied not in names
    assert not any(n.split(".")[-1].startswith("_") and n != "__future__" for n in names)
    # imported in the child, never here (aifc even warns on import, an error under pytest)
    assert "aifc" not in sys.modules and "antigravity" not in sys.modules

    json_doc = next(d for d in stdlib_docs if d.id == "stdlib:json")
    assert json_doc.text.startswith("JSON (JavaScript Object Notation)")
    assert "\ndumps(obj, *, skipkeys=False" in json_doc.text  # public functions, with signatures
    assert "class JSONDecoder" not in json_doc.text  # defined in json.decoder, documented there

    # the same order on a second walk (a prefix of it, to keep the test short)
    again = list(itertools.islice(StdlibDocs().iter_documents(), 25))
    assert again == stdlib_docs[:25]


def test_stdlib_docs_chunk_into_designer_sized_pieces(stdlib_docs):
    chunks = [c for d in stdlib_docs for c in chunk_document(d, 2000, 200)]
    assert len(chunks) > len(stdlib_docs)
    assert all(200 <= len(c.text.strip()) and len(c.text) <= 2000 for c in chunks)


def test_stdlib_deny_list():
    src = StdlibDocs()
    for name in ("antigravity", "this", "tkinter.ttk", "idlelib.run", "test", "test.support",
                 "ctypes.test.test_x", "lib2to3.tests", "venv.__main__", "_thread",
                 "concurrent.futures._base", "encodings.utf_8"):
        assert src.is_denied(name), name
    for name in ("json", "__future__", "collections.abc", "testing", "unittest"):
        assert not src.is_denied(name), name
    assert StdlibDocs(deny=()).is_denied("_thread")
    assert not StdlibDocs(deny=()).is_denied("this")


_FAKE_WORKER = r"""
import json, os, sys, time
out = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    name = line.strip()
    if name == "hang":
        time.sleep(3600)
    if name == "crash":
        os._exit(3)
    out.write(json.dumps({"module": name, "ok": True, "text": "x", "children": [],
                          "pid": os.getpid()}) + "\n")
    out.flush()
"""


def test_import_worker_survives_hangs_and_crashes(monkeypatch, tmp_path):
    script = tmp_path / "fake_worker.py"
    script.write_text(_FAKE_WORKER)
    monkeypatch.setattr(stdlib, "_STDLIB_WORKER", script)
    worker = stdlib._ImportWorker(sys.executable, timeout_s=2.0)
    try:
        first = worker.query("json")
        assert first["module"] == "json"
        assert worker.query("json")["pid"] == first["pid"]  # one child serves many imports
        assert worker.query("hang") is None
        second = worker.query("json")
        assert second["pid"] != first["pid"]  # restarted after the hang
        assert worker.query("crash") is None
        assert worker.query("json")["pid"] not in (first["pid"], second["pid"])
    finally:
        worker.close()
    assert worker._proc is None


def test_closing_the_stdlib_walk_stops_its_child(monkeypatch):
    workers = []

    class Recording(stdlib._ImportWorker):
        def __init__(self, *args):
            super().__init__(*args)
            workers.append(self)

    monkeypatch.setattr(stdlib, "_ImportWorker", Recording)
    walk = StdlibDocs().iter_documents()
    next(walk)
    proc = workers[0]._proc
    assert proc is not None and proc.poll() is None
    walk.close()
    assert proc.poll() is not None and workers[0]._proc is None


# -- sampler ----------------------------------------------------------------------------------


def take(sampler, n):
    return [c.chunk_id for c in itertools.islice(sampler, n)]


def all_chunk_ids(docs, max_chars=300, min_chars=20):
    return {c.chunk_id for d in docs for c in chunk_document(d, max_chars, min_chars)}


def sampler(tmp_path, source, name="state.json", **kw):
    kw = {"max_chars": 300, "min_chars": 20, **kw}
    return CorpusSampler(source, tmp_path / name, **kw)


def test_sampler_is_a_seeded_permutation_per_epoch(tmp_path):
    docs = make_docs(30)
    every = all_chunk_ids(docs)
    n = len(every)
    a = take(sampler(tmp_path, ListSource(docs), "a.json", seed=1), 2 * n)
    b = take(sampler(tmp_path, ListSource(docs), "b.json", seed=1), 2 * n)
    c = take(sampler(tmp_path, ListSource(docs), "c.json", seed=2), n)
    assert a == b and a[:n] != c
    assert sorted(a[:n]) == sorted(every) == sorted(a[n:]) == sorted(c)
    assert a[:n] != a[n:]  # each epoch its own order


def test_small_shuffle_buffer_still_serves_every_chunk_once(tmp_path):
    docs = make_docs(30)
    every = all_chunk_ids(docs)
    got = take(sampler(tmp_path, ListSource(docs), shuffle_buffer=8, seed=3), len(every))
    assert sorted(got) == sorted(every) and len(set(got)) == len(got)
    in_order = [c.chunk_id for d in docs for c in chunk_document(d, 300, 20)]
    assert got != in_order


def test_restart_continues_where_it_stopped(tmp_path):
    docs = make_docs(20)
    n = len(all_chunk_ids(docs))
    reference = take(sampler(tmp_path, ListSource(docs), "ref.json", seed=5), n + 10)

    first = sampler(tmp_path, ListSource(docs), seed=5)
    part1 = take(first, 7)
    first.close()
    state = json.loads((tmp_path / "state.json").read_text())
    assert (state["consumed"], state["position"], state["epoch"]) == (7, 7, 0)
    assert state["source"] == "list" and state["seed"] == 5
    assert not list(tmp_path.glob(".*.tmp"))

    second = sampler(tmp_path, ListSource(docs), seed=5)
    part2 = take(second, n + 3)  # across the epoch boundary
    assert part1 + part2 == reference
    assert second.epoch == 1 and second.consumed == n + 10
    third = sampler(tmp_path, ListSource(docs), seed=5)
    assert take(third, 1) == take(sampler(tmp_path, ListSource(docs), "ref2.json", seed=5),
                                  n + 11)[-1:]


def test_manual_commit_marks_what_was_used(tmp_path):
    docs = make_docs(10)
    reference = take(sampler(tmp_path, ListSource(docs), "ref.json"), 8)
    s = sampler(tmp_path, ListSource(docs), autocommit=False)
    assert not (tmp_path / "state.json").exists()
    got = take(s, 3)
    s.commit()
    take(s, 2)  # handed out, never committed: served again after a restart
    s.close()
    again = sampler(tmp_path, ListSource(docs), autocommit=False)
    assert got + take(again, 5) == reference


def test_commit_per_chunk_serves_exactly_the_unfinished_after_a_crash(tmp_path):
    """Documents finish out of order: committing one must not mark the others still in
    flight as used. After a restart exactly the uncommitted ones come again, in stream order,
    then the stream goes on past the ones already finished."""
    docs = make_docs(6)
    n = len(all_chunk_ids(docs))
    reference = take(sampler(tmp_path, ListSource(docs), "ref.json", seed=3), 3 * n)
    s = sampler(tmp_path, ListSource(docs), seed=3, autocommit=False)
    out = list(itertools.islice(s, 8))
    assert [c.seq for c in out] == list(range(8))
    for i in (0, 1, 3, 6):  # 2, 4, 5, 7 still in flight when the process dies
        s.commit(out[i])
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["consumed"] == 2 and state["done_ahead"] == [3, 6]
    del s  # kill -9: nothing more is written
    again = sampler(tmp_path, ListSource(docs), seed=3, autocommit=False)
    resumed = list(itertools.islice(again, 6))
    assert [c.chunk_id for c in resumed] == [reference[i] for i in (2, 4, 5, 7, 8, 9)]
    assert [c.seq for c in resumed] == [2, 4, 5, 7, 8, 9]
    for c in resumed:
        again.commit(c)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["consumed"] == 10 and state["done_ahead"] == []
    # across epoch boundaries (the source is a few chunks long, more are out than one epoch)
    s3 = sampler(tmp_path, ListSource(docs), "wrap.json", seed=3, autocommit=False)
    out = list(itertools.islice(s3, 2 * n + 2))
    for c in out:
        if c.seq != n - 1:
            s3.commit(c)
    again = sampler(tmp_path, ListSource(docs), "wrap.json", seed=3, autocommit=False)
    assert take(again, 2) == [reference[n - 1], reference[2 * n + 2]]
    assert again.epoch == 2


def test_commit_of_a_foreign_chunk_is_an_error(tmp_path):
    docs = make_docs(4)
    s = sampler(tmp_path, ListSource(docs), autocommit=False)
    first = next(s)
    with pytest.raises(ValueError, match="not handed out by this sampler"):
        s.commit(Chunk(first.doc_id, first.chunk_id, first.text, first.title))


def test_state_without_done_ahead_still_loads(tmp_path):
    """State files written before per-chunk commits (no `done_ahead`) resume as before."""
    docs = make_docs(10)
    reference = take(sampler(tmp_path, ListSource(docs), "ref.json"), 6)
    s = sampler(tmp_path, ListSource(docs), autocommit=False)
    take(s, 3)
    s.commit()
    state = json.loads((tmp_path / "state.json").read_text())
    state.pop("done_ahead")
    (tmp_path / "state.json").write_text(json.dumps(state))
    assert take(sampler(tmp_path, ListSource(docs), autocommit=False), 3) == reference[3:]


def test_state_for_another_source_or_seed_is_an_error(tmp_path):
    docs = make_docs(5)
    take(sampler(tmp_path, ListSource(docs, name="wiki"), seed=1), 2)
    with pytest.raises(CorpusStateError) as info:
        sampler(tmp_path, ListSource(docs, name="news"), seed=1)
    assert "'wiki'" in str(info.value) and "'news'" in str(info.value)
    with pytest.raises(CorpusStateError, match=r"with seed 1 .* with seed 2"):
        sampler(tmp_path, ListSource(docs, name="wiki"), seed=2)
    with pytest.raises(CorpusStateError, match="max_chars=300.*max_chars=400"):
        sampler(tmp_path, ListSource(docs, name="wiki"), seed=1, max_chars=400)
    (tmp_path / "state.json").write_text("{broken")
    with pytest.raises(CorpusStateError, match="unreadable sampler state"):
        sampler(tmp_path, ListSource(docs, name="wiki"), seed=1)


def test_empty_or_shrunken_source(tmp_path):
    with pytest.raises(CorpusError, match="yields no chunk of at least 20"):
        next(sampler(tmp_path, ListSource([Document("d", "s", "t", "too short")])))
    docs = make_docs(10)
    take(sampler(tmp_path, ListSource(docs), "grown.json"), 15)
    with pytest.raises(CorpusStateError, match="cursor at chunk 15 of epoch 0"):
        next(sampler(tmp_path, ListSource(docs[:2]), "grown.json"))


def test_sampler_over_stdlib_docs(tmp_path):
    s = CorpusSampler.from_config(CorpusConfig(seed=11), tmp_path / "stdlib.json")
    with s:
        chunks = list(itertools.islice(s, 5))
    assert len({c.chunk_id for c in chunks}) == 5
    assert all(c.chunk_id.startswith("stdlib:") and 200 <= len(c.text) <= 2000 for c in chunks)
    assert json.loads((tmp_path / "stdlib.json").read_text())["source"] == StdlibDocs().name


# -- config ---------------------------------------------------------------------------------


def test_config_builds_every_source(tmp_path):
    assert isinstance(make_source(CorpusConfig()), StdlibDocs)
    cases = {
        "jsonl": ({"path": str(tmp_path / "a.jsonl"), "id_field": "id"}, JsonlSource),
        "parquet": ({"path": str(tmp_path), "text_column": "body"}, ParquetSource),
        "textdir": ({"dir": str(tmp_path), "glob": "*.rst"}, TextDirSource),
        "hf": ({"name": "org/ds", "config": "en"}, HFDatasetSource),
        "stdlib": ({"min_doc_chars": 1000}, StdlibDocs),
    }
    for kind, (fields, cls) in cases.items():
        cfg = CorpusConfig.model_validate({"source": {"type": kind, **fields}, "seed": 3})
        assert isinstance(make_source(cfg), cls)
        assert isinstance(make_source(cfg.source), cls)
    src = make_source(HFSourceConfig(name="org/ds", split="test", revision="r1"))
    assert (src.dataset, src.split, src.revision) == ("org/ds", "test", "r1")
    assert make_source(CorpusConfig.model_validate({"source": {"type": "stdlib", "min_doc_chars": 9}})).min_doc_chars == 9


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"source": {"type": "jsonl", "path": "a", "colour": 1}}, "colour"),
        ({"source": {"type": "sqlite"}}, "sqlite"),
        ({"source": {"type": "hf"}}, "name"),
        ({"max_chars": 10}, "max_chars"),
        ({"max_chars": 500, "min_chars": 600}, "exceeds max_chars"),
        ({"sed": 1}, "sed"),
    ],
)
def test_config_errors(data, needle):
    with pytest.raises(ValidationError, match=needle):
        CorpusConfig.model_validate(data)


def test_config_is_frozen():
    cfg = CorpusConfig()
    with pytest.raises(ValidationError):
        cfg.seed = 4  # type: ignore[misc]
    assert cfg.source.type == "stdlib" and (cfg.max_chars, cfg.min_chars) == (2000, 200)


def test_documents_are_frozen():
    doc = Document("i", "s", "t", "x")
    with pytest.raises(AttributeError):
        doc.text = "y"  # type: ignore[misc]
