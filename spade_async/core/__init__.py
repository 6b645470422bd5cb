"""What the daemon, the trainer and the CLI share, and nothing else: the config tree (config/),
the batch spool between daemon and trainer (spool/), file primitives (atomic and durable writes,
JSON lines), logging, and the policy-version record the trainer writes and the daemon reads. It
imports nothing of ours but itself and memory_db, so each side can import it without importing
the other (tests/test_layout.py checks)."""
