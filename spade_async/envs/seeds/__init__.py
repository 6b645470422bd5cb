"""Hand-written seed environments: they bootstrap the memory and serve as designer examples. Each file is a standalone module run inside the sandbox; never import them into the daemon."""
