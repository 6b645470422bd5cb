"""Separate torch trainer process (issue 6). Never imports the daemon's internals."""
