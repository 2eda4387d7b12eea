"""Ratios, targets, the markdown tables and the throughput chart of one benchmark run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COST_KEYS = ("client_cmds_per_job", "server_cmds_per_job", "server_us_per_job",
             "redis_cpu_us_per_job")


def _rows(results: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    return [r for r in results["consumer"]["streamq"] if r["mode"] == mode]


def _row(results: dict[str, Any], proc: str, c: int, mode: str = "prefilled") -> dict[str, Any]:
    return next(r for r in _rows(results, mode) if r["processor"] == proc and r["concurrency"] == c)


def redis_cost(results: dict[str, Any]) -> dict[str, Any]:
    """What Redis spends per processed job (pre-filled queue, so no producer traffic) and
    per add."""
    per_job = [
        {"processor": r["processor"], "concurrency": r["concurrency"],
         **{k: r[k] for k in COST_KEYS},
         "client_commands": r["client_commands"], "server_commands": r["server_commands"]}
        for r in _rows(results, "prefilled")
    ]
    raw = results["consumer"]["raw"]["raw_async_prefilled"]
    prod = results["producer"]
    return {
        "per_processed_job": per_job,
        "raw_consume_async": {k: raw[k] for k in COST_KEYS},
        "per_add": {name: {k: prod[name][k] for k in COST_KEYS}
                    for name in ("raw_xadd_async", "sq_add_async", "raw_pipe_async",
                                 "sq_bulk_async")},
    }


def ratios(results: dict[str, Any]) -> dict[str, float]:
    p = results["producer"]
    raw = results["consumer"]["raw"]
    out = {
        "add_async_vs_raw_xadd_async": p["sq_add_async"]["rate"] / p["raw_xadd_async"]["rate"],
        "add_sync_vs_raw_xadd_sync": p["sq_add_sync"]["rate"] / p["raw_xadd_sync"]["rate"],
        "add_bulk_async_vs_raw_pipelined_async":
            p["sq_bulk_async"]["rate"] / p["raw_pipe_async"]["rate"],
        "add_bulk_sync_vs_raw_pipelined_sync":
            p["sq_bulk_sync"]["rate"] / p["raw_pipe_sync"]["rate"],
    }
    for r in results["consumer"]["streamq"]:
        base = raw[f"raw_async_{r['mode']}"]["rate"]
        out[f"worker_{r['processor']}_c{r['concurrency']}_{r['mode']}_vs_raw_async_loop"] = (
            r["rate"] / base
        )
        if r["processor"] == "sync":
            out[f"worker_sync_c{r['concurrency']}_{r['mode']}_vs_raw_sync_loop"] = (
                r["rate"] / raw[f"raw_sync_{r['mode']}"]["rate"]
            )
    for row in results["scenarios"]["rows"]:
        to = "raw_loop" if row["baseline"] == "raw" else "bound"
        out[f"scenario_{row['scenario']}_c{row['concurrency']}_vs_{to}"] = row["ratio"]
    fleet = results["scenarios"].get("processes")
    if fleet is not None:
        out[f"scenario_{fleet['scenario']}_c{fleet['concurrency']}_2_processes_vs_1"] = (
            fleet["ratio"])
    sc = results["scaling"]
    out["scaling_cmds_per_job_largest_vs_smallest_backlog"] = (
        sc[-1]["client_cmds_per_job"] / sc[0]["client_cmds_per_job"]
    )
    out["scaling_server_us_per_job_largest_vs_smallest_backlog"] = (
        sc[-1]["server_us_per_job"] / sc[0]["server_us_per_job"]
    )
    return out


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    r = results["ratios"]
    best_async = max(_rows(results, "prefilled"), key=lambda x: (x["processor"] == "async",
                                                                 x["rate"]))
    worst_cmds = max(x["client_cmds_per_job"] for x in _rows(results, "prefilled"))
    sc = results["scaling"]
    flat = max(r["scaling_cmds_per_job_largest_vs_smallest_backlog"],
               r["scaling_server_us_per_job_largest_vs_smallest_backlog"])
    mem = results["memory"]["plain"]["overhead_bytes_per_job"]
    p50 = results["latency"]["p50_ms"]
    key = f"worker_async_c{best_async['concurrency']}_prefilled_vs_raw_async_loop"
    rows = [
        ("Queue.add one at a time >= 0.8x raw redis.asyncio XADD", ">= 0.8",
         r["add_async_vs_raw_xadd_async"], r["add_async_vs_raw_xadd_async"] >= 0.8),
        ("SyncQueue.add one at a time >= 0.8x raw redis-py XADD", ">= 0.8",
         r["add_sync_vs_raw_xadd_sync"], r["add_sync_vs_raw_xadd_sync"] >= 0.8),
        ("Queue.add_bulk >= 0.7x raw pipelined XADD (async)", ">= 0.7",
         r["add_bulk_async_vs_raw_pipelined_async"],
         r["add_bulk_async_vs_raw_pipelined_async"] >= 0.7),
        ("SyncQueue.add_bulk >= 0.8x raw pipelined XADD (sync)", ">= 0.8",
         r["add_bulk_sync_vs_raw_pipelined_sync"],
         r["add_bulk_sync_vs_raw_pipelined_sync"] >= 0.8),
        (f"one worker, async no-op processor (best: c={best_async['concurrency']}) >= 0.5x "
         "raw redis.asyncio consume loop", ">= 0.5", r[key], r[key] >= 0.5),
        ("client commands per processed job (script call = 1), worst concurrency", "<= 3",
         worst_cmds, worst_cmds <= 3),
        (f"per-job cost flat from {sc[0]['backlog']:,} to {sc[-1]['backlog']:,} waiting "
         "(largest/smallest, worst of cmds/job and us/job)", "<= 1.25", flat, flat <= 1.25),
        ("Redis memory per waiting job beyond its payload (bytes)", "<= 200", mem, mem <= 200),
        ("enqueue -> processor start p50, idle queue (ms)", "< 2", p50, p50 < 2),
    ]
    batch = next((x for x in results["scenarios"]["rows"] if x["work"] == "noop-batch"), None)
    if batch is not None:
        rows.append((f"(d) no-op batch processor (max_size 100, concurrency "
                     f"{batch['concurrency']}) >= 0.6x raw consume loop (COUNT 100)", ">= 0.6",
                     batch["ratio"], batch["ratio"] >= 0.6))
    return [{"target": t, "goal": g, "value": v, "met": bool(m)} for t, g, v, m in rows]


# -- markdown ------------------------------------------------------------------------------
def _n(v: float) -> str:
    return f"{v:,.0f}"


def _table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def markdown(results: dict[str, Any]) -> str:
    m = results["meta"]
    p = results["producer"]
    raw = results["consumer"]["raw"]
    parts = [
        f"# streamq benchmark ({m['mode']} run)",
        "",
        f"{m['date']}, commit `{m['commit']}`; Python {m['python']}, redis-py {m['redis_py']} "
        f"(hiredis: {'yes' if m['hiredis'] else 'no'}), Redis {m['redis_server']}, "
        f"{m['cpus']} CPUs ({m['platform']}). Worker: {m['worker_process']}. Metrics "
        f"{m['metrics']}. Lock renewal every {m['worker_options']['lock_duration_s'] / 2:g} s, "
        f"stalled reclaim every {m['worker_options']['stalled_interval_s']:g} s. "
        f"Figures are the median of the runs listed.",
        "",
        "## Targets",
        "",
        _table(["target", "goal", "measured", "met"],
               [[t["target"], t["goal"], f"{t['value']:.3g}", "yes" if t["met"] else "**no**"]
                for t in results["targets"]]),
        "",
        f"## Producer (jobs/s; bulk batches of {p['batch']})",
        "",
    ]
    prod_rows = []
    for label, raw_k, sq_k in (
        ("one at a time, sync", "raw_xadd_sync", "sq_add_sync"),
        ("one at a time, asyncio", "raw_xadd_async", "sq_add_async"),
        ("bulk, sync", "raw_pipe_sync", "sq_bulk_sync"),
        ("bulk, asyncio", "raw_pipe_async", "sq_bulk_async"),
    ):
        a, b = p[raw_k], p[sq_k]
        prod_rows.append([label, _n(a["rate"]), _n(b["rate"]), f"{b['rate'] / a['rate']:.2f}",
                          f"{a['server_us_per_job']:.2f} / {b['server_us_per_job']:.2f}",
                          f"{a['redis_cpu_us_per_job']:.1f} / {b['redis_cpu_us_per_job']:.1f}"])
    parts += [_table(["", "raw redis-py", "streamq", "ratio",
                      "server us/job (raw / streamq)", "Redis CPU us/job (raw / streamq)"],
                     prod_rows), ""]

    parts += ["## Consumer: no-op processing by one worker process (jobs/s)", ""]
    crow = []
    for mode in ("prefilled", "with_producer"):
        ra, rs = raw[f"raw_async_{mode}"], raw[f"raw_sync_{mode}"]
        crow.append(["raw redis.asyncio loop (COUNT 100, XACK+XDEL)", mode, "", _n(ra["rate"]),
                     "1.00", f"{ra['client_cmds_per_job']:.3f}", f"{ra['server_us_per_job']:.2f}"])
        crow.append(["raw redis-py loop (COUNT 100, XACK+XDEL)", mode, "", _n(rs["rate"]),
                     f"{rs['rate'] / ra['rate']:.2f}", f"{rs['client_cmds_per_job']:.3f}",
                     f"{rs['server_us_per_job']:.2f}"])
        for r in _rows(results, mode):
            crow.append([f"streamq, {r['processor']} processor", mode, str(r["concurrency"]),
                         _n(r["rate"]), f"{r['rate'] / ra['rate']:.2f}",
                         f"{r['client_cmds_per_job']:.3f}" if mode == "prefilled" else "-",
                         f"{r['server_us_per_job']:.2f}" if mode == "prefilled" else "-"])
    parts += [_table(["consumer", "queue", "concurrency", "jobs/s", "vs raw asyncio loop",
                      "client cmds/job", "server us/job"], crow), ""]
    prod_rates = [r["producer"]["rate"] for r in _rows(results, "with_producer")
                  if "producer" in r]
    if prod_rates:
        parts += [f"With a producer: a child process runs `Queue.add_bulk` (batches of 100) "
                  f"while the worker consumes; it reached {_n(min(prod_rates))}-"
                  f"{_n(max(prod_rates))} jobs/s. Per-job costs are given for pre-filled "
                  "queues only (the producer's commands would be counted too).", ""]

    parts += scenarios_markdown(results["scenarios"])

    parts += ["## Redis cost per processed job (pre-filled queue)", "",
              "Client commands count a script call once; server commands include the "
              "commands each script runs inside Redis. Server us: commandstats time of the "
              "client's own commands (a script's time includes its inner commands). Redis "
              "CPU: the server process's user+sys time, which also covers network I/O.", ""]
    cost_rows = [[f"streamq, {c['processor']} processor", str(c["concurrency"]),
                  f"{c['client_cmds_per_job']:.3f}", f"{c['server_cmds_per_job']:.2f}",
                  f"{c['server_us_per_job']:.2f}", f"{c['redis_cpu_us_per_job']:.2f}"]
                 for c in results["redis_cost"]["per_processed_job"]]
    rc = results["redis_cost"]["raw_consume_async"]
    cost_rows.insert(0, ["raw redis.asyncio loop", "batch 100", f"{rc['client_cmds_per_job']:.3f}",
                         f"{rc['server_cmds_per_job']:.2f}", f"{rc['server_us_per_job']:.2f}",
                         f"{rc['redis_cpu_us_per_job']:.2f}"])
    parts += [_table(["consumer", "concurrency", "client cmds/job", "server cmds/job",
                      "server us/job", "Redis CPU us/job"], cost_rows), ""]

    lat = results["latency"]
    parts += ["## Latency: enqueue to processor start (idle queue)", "",
              f"A producer process adds one job at a time at {lat['rate']:g} jobs/s "
              f"(reached {lat['producer_rate']:.0f}); one worker, async processor, concurrency "
              f"{lat['concurrency']}; {lat['jobs']} jobs.", "",
              _table(["p50", "p95", "p99", "max", "mean"],
                     [[f"{lat[k]:.2f} ms" for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms",
                                                    "mean_ms")]]), ""]

    mem = results["memory"]
    parts += ["## Redis memory per waiting job", "",
              _table(["jobs", "job ids", "bytes/job", "payload bytes/job", "beyond payload"],
                     [[_n(x["jobs"]), "caller-given (dedup marker)" if x["with_job_id"]
                       else "generated", f"{x['bytes_per_job']:.0f}",
                       f"{x['payload_bytes_per_job']:.0f}", f"{x['overhead_bytes_per_job']:.0f}"]
                      for x in (mem["plain"], mem["with_job_id"])]), ""]

    parts += ["## Scaling with backlog (async processor, concurrency 100)", "",
              _table(["waiting jobs", "jobs measured", "client cmds/job", "server cmds/job",
                      "server us/job", "Redis CPU us/job", "jobs/s"],
                     [[_n(s["backlog"]), _n(s["jobs"]), f"{s['client_cmds_per_job']:.3f}",
                       f"{s['server_cmds_per_job']:.2f}", f"{s['server_us_per_job']:.2f}",
                       f"{s['redis_cpu_us_per_job']:.2f}", _n(s["rate"])]
                      for s in results["scaling"]]), ""]
    return "\n".join(parts)


def _pair(a: dict[str, Any], b: dict[str, Any] | None, key: str, fmt: str) -> str:
    return f"{a[key]:{fmt}} / {b[key]:{fmt}}" if b is not None else f"{a[key]:{fmt}} / -"


def scenarios_markdown(sc: dict[str, Any]) -> list[str]:
    """The processing scenarios' table: streamq against its baseline, per-job costs, memory."""
    rows = []
    for r in sc["rows"]:
        s, raw, alone = r["streamq"], r["raw"], r["work_alone"]
        to = "raw loop" if r["baseline"] == "raw" else f"bound {_n(r['bound'])}"
        rss = f"{s['rss_idle_mb']:.0f} -> {s['rss_peak_mb']:.0f}"
        if raw is not None:
            rss += f" / {raw['rss_idle_mb']:.0f} -> {raw['rss_peak_mb']:.0f}"
        rows.append([f"({r['scenario']}) {r['title']}", str(r["concurrency"]), _n(s["rate"]),
                     _n(raw["rate"]) if raw is not None else "-", f"{r['ratio']:.2f} ({to})",
                     _pair(s, raw, "queue_cmds_per_job", ".3f"),
                     _pair(s, raw, "redis_cpu_us_per_job", ".1f"), rss,
                     _n(alone["rate"]) if alone is not None else "-"])
    for p in sc["pending"]:
        rows.append([f"({p['scenario']}) {p['what']}", "", "not measured yet", "", "", "", "",
                     "", ""])
    out = [
        "## Processing scenarios: per-job work, one worker process (jobs/s)", "",
        "Each run in a process of its own on a pre-filled queue; the raw loop does "
        "`XREADGROUP COUNT c`, the batch's work concurrently (tasks sharing one client, or c "
        "threads), then `XACK` + `XDEL` in one pipeline. Queue commands per job leave out the "
        "processor's own calls and connection handshakes; Redis CPU includes the processor's "
        "calls (both sides make the same ones). Resident memory: idle (started, no job) -> "
        "peak while processing. Work alone: the per-job calls with no queue, c tasks or "
        "threads on one client.", "",
        _table(["scenario", "concurrency", "streamq", "raw loop", "ratio (to)",
                "queue cmds/job (streamq / raw)", "Redis CPU us/job (streamq / raw)",
                "RSS MiB idle -> peak (streamq / raw)", "work alone"], rows), "",
    ]
    fleet = sc.get("processes")
    if fleet is not None:
        frows = [[str(x["processes"]), _n(x["rate"]),
                  f"{x['rate'] / fleet['one']['rate']:.2f}", f"{x['queue_cmds_per_job']:.3f}",
                  f"{x['server_queue_cmds_per_job']:.2f}", f"{x['redis_cpu_us_per_job']:.1f}",
                  f"{x['seconds']:.2f}"]
                 for x in (fleet["one"], fleet["two"])]
        out += [
            f"### ({fleet['scenario']}) Several worker processes: `python -m worker`, "
            f"`WORKER_PROCESSES` 1 and 2", "",
            f"The processor of (a) (one INCR per job, concurrency {fleet['concurrency']} per "
            f"process); {_n(fleet['one']['jobs'])} jobs added at once by one Lua script once "
            "every process is consuming, timed until `XLEN` is 0 (startup not measured). "
            "Queue commands per job: those the worker processes sent, the INCRs and "
            "connection handshakes left out. Ratio 2 processes / 1: "
            f"**{fleet['ratio']:.2f}**.", "",
            _table(["worker processes", "jobs/s", "vs 1 process", "queue cmds/job",
                    "server queue cmds/job", "Redis CPU us/job", "drain s"], frows), "",
        ]
    return out


# -- chart ---------------------------------------------------------------------------------
def chart(results: dict[str, Any], path: Path) -> bool:
    """Throughput against concurrency; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    raw = results["consumer"]["raw"]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    styles = {("async", "prefilled"): ("tab:blue", "-"), ("sync", "prefilled"): ("tab:orange", "-"),
              ("async", "with_producer"): ("tab:blue", "--"),
              ("sync", "with_producer"): ("tab:orange", "--")}
    for (proc, mode), (color, ls) in styles.items():
        rows = sorted((r for r in _rows(results, mode) if r["processor"] == proc),
                      key=lambda r: r["concurrency"])
        label = f"streamq, {proc} processor, {mode.replace('_', ' ')}"
        ax.plot([r["concurrency"] for r in rows], [r["rate"] for r in rows], marker="o",
                color=color, linestyle=ls, label=label)
    for key, color in (("raw_async_prefilled", "tab:green"), ("raw_sync_prefilled", "tab:red")):
        ax.axhline(raw[key]["rate"], color=color, linestyle=":",
                   label=f"raw {'redis.asyncio' if 'async' in key else 'redis-py'} loop "
                         "(COUNT 100), pre-filled")
    ax.axhline(raw["raw_async_prefilled"]["rate"] * 0.5, color="gray", linestyle="--",
               linewidth=1, label="target: 0.5x the raw redis.asyncio loop")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks([1, 10, 100], labels=["1", "10", "100"])
    ax.set_xlabel("worker concurrency")
    ax.set_ylabel("jobs/s (one worker process)")
    m = results["meta"]
    ax.set_title(f"No-op processing throughput ({m['mode']} run, {m['cpus']} CPUs, "
                 f"Redis {m['redis_server']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
