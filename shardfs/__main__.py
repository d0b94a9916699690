"""``python -m shardfs``: the ``shardfs`` command line (see shardfs.cli)."""

import sys

from shardfs.cli import main

if __name__ == "__main__":
    sys.exit(main())
