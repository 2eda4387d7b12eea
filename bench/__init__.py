"""streamq's benchmark suite: raw redis-py baselines and streamq, measured in one run.

Run it with ``./scripts/bench`` (or ``python -m bench.run --quick`` / ``--full``); see
docs/performance.md for what each figure means.
"""
