"""``python -m memreclaim``: see :mod:`memreclaim.cli`."""

from __future__ import annotations

import sys

from memreclaim.cli import main

if __name__ == "__main__":
    sys.exit(main())
