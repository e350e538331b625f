"""``python -m tidal.cli``: the ``tidal`` command."""

from tidal.cli.main import main

if __name__ == "__main__":
    main()
