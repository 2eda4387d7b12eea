"""The dashboard app driven in-process by httpx (same event loop as the test's Redis client)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from streamq.dashboard import create_app

TOKEN = "dashboard-test-token-0123456789"
ROOT_DIR = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def dashboard(
    contracts: Any, client: Any, prefix: str, **options: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client talking to a dashboard over ``contracts``; the rate sampler is stopped
    on the way out."""
    app = create_app(contracts, client, prefix=prefix, **options)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://dash.test") as http:
            yield http
    finally:
        await app.state.dashboard.sampler.close()


def cells(html: str, row_attr: str, value: str) -> dict[str, str]:
    """``{data-field: text}`` of the table row whose ``row_attr`` is ``value``."""
    m = re.search(rf'<tr[^>]*{row_attr}="{re.escape(value)}"[^>]*>(.*?)</tr>', html, re.S)
    assert m, f"no row {row_attr}={value!r}"
    return {
        f: re.sub(r"<[^>]+>", "", v).strip()
        for f, v in re.findall(r'data-field="([a-z_]+)">(.*?)</td>', m.group(1), re.S)
    }
