"""The core runtime never imports prometheus_client or opentelemetry: a worker runs with both
missing, the adapters fail at import with an install hint, and build_hooks does without."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.redis_server import RedisServer

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import asyncio, importlib.abc, json, os, sys

    BLOCKED = ("prometheus_client", "opentelemetry")
    importers = []

    def importer():
        # The module whose code asked for the import: the innermost frame outside this
        # finder and the import machinery. Named by its module name, not its file path: a
        # path test would also match the venv's site-packages when the checkout folder
        # happens to be called "streamq".
        frame = sys._getframe(2)
        while frame is not None:
            module = frame.f_globals.get("__name__") or ""
            if module != "importlib" and not module.startswith("importlib."):
                return module, os.path.realpath(frame.f_code.co_filename)
            frame = frame.f_back
        return "", ""

    class Missing(importlib.abc.MetaPathFinder):
        # Behave as if the extras were not installed, and note who asked for them.
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] not in BLOCKED:
                return None
            importers.append((name, *importer()))
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, Missing())

    import redis.asyncio as aioredis
    import streamq
    from streamq import App, Job, Queue, WorkerManager
    from tests.observability.support import FAST, Obs, Work

    async def main(url, prefix):
        app = App([Obs])
        done = []

        @app.processor(Obs, **FAST)
        async def process(job: Job[Work]) -> None:
            done.append(job.id)

        client = aioredis.Redis.from_url(url)
        queue = Queue(Obs, client, prefix=prefix)
        manager = WorkerManager(redis_url=url, prefix=prefix)
        manager.register_app(app)
        await manager.start()
        for i in range(3):
            await queue.add(Obs.work, Work(project_id="p", n=i))
        await manager.run_until_idle(timeout_s=10)
        from streamq.observe import ObservabilityConfig, build_hooks, start
        hooks = build_hooks(ObservabilityConfig())
        server = await start(manager, ObservabilityConfig())
        await server.close()
        await manager.close_workers(timeout_s=1)
        await client.aclose()
        hints = {}
        for mod in ("streamq.metrics", "streamq.tracing"):
            try:
                __import__(mod)
            except ImportError as exc:
                hints[mod] = str(exc)
        return {
            "done": len(done),
            "adapters": [type(h).__name__ for h in hooks.hooks],
            "hints": hints,
        }

    out = asyncio.run(main(sys.argv[1], sys.argv[2]))
    out["loaded"] = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    out["streamq_importers"] = [
        (n, m, f) for n, m, f in importers if m == "streamq" or m.startswith("streamq.")
    ]
    out["streamq_dir"] = os.path.dirname(os.path.realpath(streamq.__file__))
    print(json.dumps(out))
    """
)


def test_a_worker_runs_without_the_extras_and_streamq_never_imports_them(
    redis_server: RedisServer, prefix: str
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, redis_server.url, prefix],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["done"] == 3
    assert out["loaded"] == []
    # Only the adapters ask for their library (and fail with a hint), and build_hooks probes
    # for them; no core module does.
    askers = {module for _, module, _ in out["streamq_importers"]}
    assert askers - {"streamq.observe"} == {"streamq.metrics", "streamq.tracing"}, out
    # ...and those are the package's own files, wherever the checkout and the venv live.
    streamq_dir = Path(out["streamq_dir"])
    for _, module, path in out["streamq_importers"]:
        assert Path(path).parent == streamq_dir, (module, path)
    assert "pip install 'streamq[metrics]'" in out["hints"]["streamq.metrics"]
    assert "pip install 'streamq[tracing]'" in out["hints"]["streamq.tracing"]
    assert out["adapters"] == ["JobLogHooks", "RedisHealth"]
