"""`python -m trainer` (and the `spade-train` console script)."""

from __future__ import annotations

import sys

from trainer.launcher import main as _main


def main() -> None:
    sys.exit(_main())


if __name__ == "__main__":
    main()
