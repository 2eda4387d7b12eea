"""The dashboard's Starlette application: pages, fragments for live refresh, a JSON API and
the actions (retry, purge, pause, resume) behind :class:`~streamq.dashboard.security.Access`.

Pages are rendered on the server (Jinja2, autoescaped). ``static/dashboard.js`` (no build
step, no CDN) swaps the elements marked ``data-refresh`` with fresh HTML fragments every few
seconds, and remembers the token typed in an action form for the browser tab.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import jinja2
from redis.exceptions import RedisError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from streamq._redis import map_error
from streamq.contracts import Lane
from streamq.dashboard import data
from streamq.dashboard import formatting as fmt
from streamq.dashboard.rates import Rates, RateSampler
from streamq.dashboard.security import SECURITY_HEADERS, TOKEN_HEADER, Access
from streamq.errors import ConfigurationError, RedisUnavailable, StreamqError

__all__ = ["build"]

HERE = Path(__file__).parent
MAX_FORM_BYTES = 64 * 1024
DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
MAX_COUNTED = 5000
"""Dead letters up to which the filter shows a count per reason (counting reads them all)."""
REASONS = ("error", "permanent", "timeout", "invalid_payload", "unknown_job", "stalled",
           "lost_payload")
NOTICES = {
    "paused": "Paused {queue}: workers start no new jobs; running jobs finish.",
    "resumed": "Resumed {queue}.",
    "retried": "Re-enqueued {n} job(s) of {queue} from its dead letters.",
    "purged": "Deleted {n} dead letter(s) of {queue}.",
}

Handler = Callable[[Request], Awaitable[Response]]


class Dashboard:
    """The state behind the routes: where to read, who may act, the rate sampler."""

    def __init__(
        self, src: data.Source, access: Access, sampler: RateSampler, refresh_s: float
    ) -> None:
        self.src = src
        self.access = access
        self.sampler = sampler
        self.refresh_s = refresh_s
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
        )
        env.filters.update(age=fmt.age, when=fmt.when, rate=fmt.rate, pretty=fmt.pretty)
        env.globals["confirm_query"] = confirm_query
        self.templates = Jinja2Templates(env=env)

    def render(
        self, request: Request, name: str, status_code: int = 200, **context: Any
    ) -> Response:
        self.sampler.start()  # mounted apps get no lifespan: start on the first page
        base = {
            "access": self.access,
            "refresh_ms": int(self.refresh_s * 1000),
            "lanes": self.src.lanes(),
            "has_schedules": bool(self.src.app and (self.src.app.schedules
                                                    or self.src.app.runners)),
        }
        return self.templates.TemplateResponse(
            request, name, {**base, **context}, status_code=status_code, headers=SECURITY_HEADERS
        )

    def error(self, request: Request, status: int, message: str) -> Response:
        if _wants_json(request):
            return JSONResponse({"error": message}, status, headers=SECURITY_HEADERS)
        return self.render(request, "error.html", status, message=message, code=status)

    # -- reading -------------------------------------------------------------------------
    async def lanes(self) -> list[tuple[data.LaneView, Rates | None]]:
        views = [await data.read_lane(self.src, lane) for lane in self.src.lanes()]
        return [(v, self.sampler.rates(v.name)) for v in views]

    def lane(self, request: Request) -> Lane:
        return self.src.lane(request.path_params["queue"])


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api/") or "application/json" in request.headers.get(
        "accept", ""
    )


def _limit(request: Request) -> int:
    raw = request.query_params.get("limit", str(DEFAULT_LIMIT))
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise ConfigurationError(f"limit must be an integer 1..{MAX_LIMIT}, got {raw[:20]!r} "
                                 "(field 'limit')")
    return int(raw)


def _reason(request: Request, lane: Lane) -> str | None:
    reason = request.query_params.get("reason") or None
    if reason is not None and reason not in REASONS:
        raise ConfigurationError(
            f"queue {lane.name!r}: unknown dead-letter reason {reason[:40]!r}; reasons: "
            f"{', '.join(REASONS)} (field 'reason')",
            queue=lane.name,
        )
    return reason


async def _form(request: Request) -> dict[str, list[str]]:
    """The url-encoded body (the only kind the pages send), at most 64 KiB."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise ConfigurationError(f"form too large (over {MAX_FORM_BYTES} bytes)")
    ctype = request.headers.get("content-type", "").split(";")[0].strip()
    if body and ctype not in ("application/x-www-form-urlencoded", ""):
        raise ConfigurationError(
            f"actions take an application/x-www-form-urlencoded form, got {ctype!r}"
        )
    return parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)


def _one(form: dict[str, list[str]], name: str) -> str | None:
    values = form.get(name)
    return values[0] if values else None


# -- pages -------------------------------------------------------------------------------------


def _page(dash: Dashboard, handler: Callable[[Dashboard, Request], Awaitable[Response]]) -> Handler:
    """Wrap a handler: bad input answers 400/404 naming what was wrong, Redis trouble 503."""

    async def endpoint(request: Request) -> Response:
        try:
            return await handler(dash, request)
        except ConfigurationError as exc:
            status = 404 if str(exc).startswith("unknown queue") else 400
            return dash.error(request, status, str(exc))
        except RedisUnavailable as exc:
            return dash.error(request, 503, f"Redis is unreachable: {exc}")
        except StreamqError as exc:
            return dash.error(request, 503, f"Redis failed: {exc}")
        except (RedisError, OSError) as exc:  # a call made outside the admin classes
            mapped = map_error(exc)
            return dash.error(request, 503, str(mapped or f"Redis failed: {exc}"))

    return endpoint


async def overview(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "overview.html", rows=await dash.lanes(),
                       notice=_notice(request))


async def queues_fragment(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "_queues.html", rows=await dash.lanes())


async def api_queues(dash: Dashboard, request: Request) -> Response:
    dash.sampler.start()
    out = []
    for view, rates in await dash.lanes():
        row = view.to_dict()
        row["rates_per_min"] = None if rates is None else {
            "in": round(rates.in_per_min, 3),
            "out": round(rates.out_per_min, 3),
            "dead": round(rates.dead_per_min, 3),
            "window_s": round(rates.window_s, 1),
        }
        out.append(row)
    return JSONResponse(out, headers=SECURITY_HEADERS)


async def queue_page(dash: Dashboard, request: Request) -> Response:
    lane = dash.lane(request)
    view = await data.read_lane(dash.src, lane)
    consumers = await data.read_consumers(dash.src, lane)
    return dash.render(request, "queue.html", lane=lane, view=view,
                       rates=dash.sampler.rates(lane.name), consumers=consumers,
                       notice=_notice(request))


async def queue_fragment(dash: Dashboard, request: Request) -> Response:
    lane = dash.lane(request)
    view = await data.read_lane(dash.src, lane)
    consumers = await data.read_consumers(dash.src, lane)
    return dash.render(request, "_queue.html", lane=lane, view=view,
                       rates=dash.sampler.rates(lane.name), consumers=consumers)


async def dead_list(dash: Dashboard, request: Request) -> Response:
    lane = dash.lane(request)
    reason, limit = _reason(request, lane), _limit(request)
    dead = dash.src.dead(lane)
    letters = await dead.list(limit, reason=reason)
    total = await dead.count()
    # Counting by reason reads every record: past a few thousand, offer the reasons alone.
    counts: dict[str, int | None] = dict.fromkeys(REASONS)
    if total <= MAX_COUNTED:
        counts = dict(await dead.count(by_reason=True))
    return dash.render(request, "dead_list.html", lane=lane, letters=letters, counts=counts,
                       reason=reason, limit=limit, total=total, notice=_notice(request))


async def dead_one(dash: Dashboard, request: Request) -> Response:
    lane = dash.lane(request)
    ref = f"{request.path_params['shard']}/{request.path_params['entry']}"
    letter = await data.read_dead_letter(dash.src, lane, ref)
    if letter is None:
        return dash.error(request, 404, f"queue {lane.name!r} has no dead letter {ref!r} "
                                        "(retried or purged already?)")
    return dash.render(request, "dead_one.html", lane=lane, letter=letter)


async def dead_confirm(dash: Dashboard, request: Request) -> Response:
    """The confirmation step of retry and purge: says what will happen, asks for the token."""
    lane = dash.lane(request)
    action = request.query_params.get("action", "")
    if action not in ("retry", "purge"):
        raise ConfigurationError(f"action must be retry or purge, got {action[:20]!r} "
                                 "(field 'action')")
    refs = request.query_params.getlist("ref")
    everything = request.query_params.get("all") == "1"
    if everything == bool(refs):
        raise ConfigurationError("give dead letters (field 'ref') or all=1, one of them")
    letters = []
    for ref in refs:
        letter = await data.read_dead_letter(dash.src, lane, ref)
        if letter is None:
            raise ConfigurationError(f"queue {lane.name!r} has no dead letter {ref!r} "
                                     "(field 'ref')", queue=lane.name)
        letters.append(letter)
    total = await dash.src.dead(lane).count() if everything else len(letters)
    return dash.render(request, "confirm.html", lane=lane, action=action, letters=letters,
                       everything=everything, total=total)


async def job_lookup(dash: Dashboard, request: Request) -> Response:
    job_id = request.query_params.get("id")
    found = None if job_id is None else await data.find_job(dash.src, job_id)
    return dash.render(request, "job.html", job_id=job_id or "", found=found)


async def schedules_page(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "schedules.html",
                       schedules=await data.read_schedules(dash.src),
                       runners=await data.read_runners(dash.src))


# -- actions -----------------------------------------------------------------------------------


async def _authorised(dash: Dashboard, request: Request) -> dict[str, list[str]] | Response:
    form = await _form(request)
    given = request.headers.get(TOKEN_HEADER) or _one(form, "token")
    why = dash.access.refusal(given, request.headers.get("origin"),
                              request.headers.get("host"))
    if why is not None:
        return dash.error(request, 403, why)
    return form


def _done(request: Request, lane: Lane, page: str, notice: str, n: int | None = None) -> Response:
    if _wants_json(request):
        return JSONResponse({"queue": lane.name, "done": notice, "count": n},
                            headers=SECURITY_HEADERS)
    query = {"done": notice} if n is None else {"done": notice, "n": str(n)}
    url = request.url_for(page, queue=lane.name).include_query_params(**query)
    return RedirectResponse(str(url), 303, headers=SECURITY_HEADERS)


def _notice(request: Request) -> str | None:
    template = NOTICES.get(request.query_params.get("done", ""))
    if template is None:
        return None
    n = request.query_params.get("n", "0")
    return template.format(queue=request.path_params.get("queue", ""),
                           n=int(n) if n.isdigit() else 0)


async def pause_action(dash: Dashboard, request: Request) -> Response:
    lane = dash.lane(request)
    form = await _authorised(dash, request)
    if isinstance(form, Response):
        return form
    admin = dash.src.admin(lane)
    paused = request.url.path.endswith("/pause")
    await (admin.pause() if paused else admin.resume())
    return _done(request, lane, "queue", "paused" if paused else "resumed")


async def dead_action(dash: Dashboard, request: Request) -> Response:
    lane = dash.lane(request)
    form = await _authorised(dash, request)
    if isinstance(form, Response):
        return form
    if _one(form, "confirm") != "yes":
        raise ConfigurationError("confirm the action first (field 'confirm' must be 'yes')",
                                 queue=lane.name)
    refs = form.get("ref", [])
    everything = _one(form, "all") == "1"
    if everything == bool(refs):
        raise ConfigurationError("give dead letters (field 'ref') or all=1, one of them",
                                 queue=lane.name)
    dead = dash.src.dead(lane)
    if request.url.path.endswith("/retry"):
        n = await (dead.retry(all=True) if everything else dead.retry(refs))
        return _done(request, lane, "dead_list", "retried", n)
    n = await (dead.purge(all=True) if everything else dead.purge(refs))
    return _done(request, lane, "dead_list", "purged", n)


def build(
    src: data.Source,
    access: Access,
    *,
    refresh_s: float,
    sampler: RateSampler,
) -> Starlette:
    """The Starlette app over ``src`` (see :func:`streamq.dashboard.create_app`)."""
    dash = Dashboard(src, access, sampler, refresh_s)

    def r(path: str, fn: Any, name: str, methods: tuple[str, ...] = ("GET",)) -> Route:
        return Route(path, _page(dash, fn), name=name, methods=list(methods))

    routes = [
        r("/", overview, "overview"),
        r("/fragments/queues", queues_fragment, "queues_fragment"),
        r("/api/queues", api_queues, "api_queues"),
        r("/jobs", job_lookup, "job_lookup"),
        r("/schedules", schedules_page, "schedules"),
        r("/queues/{queue}", queue_page, "queue"),
        r("/queues/{queue}/fragment", queue_fragment, "queue_fragment"),
        r("/queues/{queue}/pause", pause_action, "pause", ("POST",)),
        r("/queues/{queue}/resume", pause_action, "resume", ("POST",)),
        r("/queues/{queue}/dead", dead_list, "dead_list"),
        r("/queues/{queue}/dead/confirm", dead_confirm, "dead_confirm"),
        r("/queues/{queue}/dead/retry", dead_action, "dead_retry", ("POST",)),
        r("/queues/{queue}/dead/purge", dead_action, "dead_purge", ("POST",)),
        r("/queues/{queue}/dead/{shard}/{entry}", dead_one, "dead_one"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        sampler.start()
        try:
            yield
        finally:
            await sampler.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.dashboard = dash
    return app


def confirm_query(action: str, refs: list[str] | None = None, everything: bool = False) -> str:
    """The query string of a confirmation page."""
    pairs: list[tuple[str, str]] = [("action", action)]
    pairs += [("ref", ref) for ref in refs or ()]
    if everything:
        pairs.append(("all", "1"))
    return urlencode(pairs)

