"""`python -m spade_async.cli`: the `spade` console script."""

from spade_async.cli import app

app()
