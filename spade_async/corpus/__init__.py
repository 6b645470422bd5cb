"""The corpus stage: documents in, chunks out to the designer (DESIGN §2).

A source (`stdlib`, `files`, `hf`; built from config by `sources.make_source`) yields whole
`Document`s in a deterministic order; `chunking` cuts them into `Chunk`s of bounded size;
`sampler.CorpusSampler` shuffles chunks with a seeded buffer and persists its cursor atomically
so a restarted daemon never resamples a chunk it already used.

Everything here is synchronous and may block (imports in a subprocess, file and network reads):
the daemon calls it off the event loop (`anyio.to_thread.run_sync`).
"""
