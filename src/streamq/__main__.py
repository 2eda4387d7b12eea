"""``python -m streamq``: the admin command (see :mod:`streamq.cli`)."""

from streamq.cli import run

if __name__ == "__main__":
    run()
