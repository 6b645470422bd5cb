"""What the daemon, the trainer and the CLI share, and nothing else: file primitives (atomic and
durable writes, JSON lines) and the policy-version record the trainer writes and the daemon
reads. It imports no other module of spade_async, trainer or memory_db, so each side can import
it without importing the other (tests/test_layout.py checks)."""
