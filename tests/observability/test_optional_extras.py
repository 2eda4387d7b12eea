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
    import asyncio, importlib.abc, json, sys, traceback

    BLOCKED = ("prometheus_client", "opentelemetry")
    importers = []

    class Missing(importlib.abc.MetaPathFinder):
        # Behave as if the extras were not installed, and note who asked for them.
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] not in BLOCKED:
                return None
            frames = [f.filename for f in traceback.extract_stack()
                      if "importlib" not in f.filename and f.filename != "<string>"]
            importers.append((name, frames[-1] if frames else ""))
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
        (n, f) for n, f in importers if "/streamq/" in f.replace("\\\\", "/")
    ]
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
    askers = {f.rsplit("/", 1)[-1] for _, f in out["streamq_importers"]}
    assert askers - {"observe.py"} == {"metrics.py", "tracing.py"}
    assert "pip install 'streamq[metrics]'" in out["hints"]["streamq.metrics"]
    assert "pip install 'streamq[tracing]'" in out["hints"]["streamq.tracing"]
    assert out["adapters"] == ["JobLogHooks", "RedisHealth"]
