"""Regret batches and the spool: the process boundary between the daemon and the trainer (DESIGN §8).

The daemon writes each batch of training samples (both roles) as one Arrow IPC file with a
monotonically increasing sequence number; the trainer, another process, reads them strictly in
order and acknowledges what its checkpoint holds, which lets old files be collected.

What it must never do: expose a partial batch (files appear by rename only, after fsync), skip or
reuse a sequence number (a missing batch stops the reader; numbers survive restarts and gc), or
let two writers share a directory (an flock on `writer.lock`). It imports nothing from the daemon,
so the trainer may import it for the schema.

batch.py is the batch contract (the Arrow schema, Sample and its checks, the conversion to a
table and back), base.py the abstract spool, files.py the directory of Arrow files.
"""
