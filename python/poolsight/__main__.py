"""``python -m poolsight`` and the ``poolsight`` console script: the Rust CLI."""

import sys


def main() -> None:
    from . import main as run

    sys.exit(run())


if __name__ == "__main__":
    main()
