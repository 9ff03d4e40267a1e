"""The load generator: :class:`Soak` runs the agents (:class:`~benchmarks.soak.agents.Agents`) with a
sampler of the gateway's resources and a ``/health`` prober until the deadline."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

from benchmarks.soak.agents import Agents
from benchmarks.soak.readings import dir_bytes, parse_metrics, proc_status


class Soak(Agents):
    # ---- observers -------------------------------------------------------------------------------
    async def sample(self, session) -> None:
        t = time.monotonic() - self.t0
        s: dict[str, Any] = {"t": round(t, 1), "load1": os.getloadavg()[0],
                             "requests": sum(st.requests for st in self.stats.values())}
        if self.gateway.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                s.update(proc_status(self.gateway.pid))
        if self.mcp_proc is not None and self.mcp_proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                s["mcp_rss_mb"] = proc_status(self.mcp_proc.pid)["rss_mb"]
        s["log_bytes"], s["log_disk_bytes"], s["log_files"] = dir_bytes(self.log_dir)
        s["cache_bytes"], s["cache_disk_bytes"], s["cache_files"] = dir_bytes(self.cache_dir)
        try:
            async with session.get(f"{self.gw}/metrics") as r:
                s["metrics"] = parse_metrics((await r.read()).decode())
        except Exception as e:  # noqa: BLE001
            s["metrics_error"] = type(e).__name__
        self.samples.append(s)

    async def sampler(self, session, deadline: float) -> None:
        while not self.stop and time.monotonic() < deadline:
            await self.sample(session)
            if self.gateway.poll() is not None:
                self.died_at, self.stop = time.monotonic() - self.t0, True
                return
            await asyncio.sleep(self.args.sample_every)

    async def prober(self, session, deadline: float) -> None:
        import aiohttp

        while not self.stop and time.monotonic() < deadline:
            t = time.monotonic()
            status = None
            try:
                async with session.get(f"{self.gw}/health", timeout=aiohttp.ClientTimeout(total=60)) as r:
                    await r.read()
                    status = r.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            self.health.append((round(t - self.t0, 2), (time.monotonic() - t) * 1e3, status))
            await asyncio.sleep(1.0)

    async def run(self) -> None:
        import aiohttp
        import openai

        duration = self.args.minutes * 60
        self.t0 = time.monotonic()
        deadline = self.t0 + duration
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=timeout) as session, \
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=70)) as observer:
            sdk = openai.AsyncOpenAI(base_url=f"{self.gw}/v1", api_key="soak-client-key", max_retries=0,
                                     timeout=120.0)
            clients = [asyncio.ensure_future(self.client(session, sdk, c, deadline))
                       for c in range(self.args.clients)]
            watchers = [asyncio.ensure_future(self.sampler(observer, deadline)),
                        asyncio.ensure_future(self.prober(observer, deadline))]
            if self.mcp is not None:
                clients.append(asyncio.ensure_future(self.mcp.run(deadline)))
            # every episode is bounded (a few requests, each within 120 s): the last ones end soon after the
            # deadline
            _, pending = await asyncio.wait(clients, timeout=duration + 300)
            self.stop = True
            if self.mcp is not None:
                self.mcp.stop = True
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, *watchers, return_exceptions=True)
            await self.sample(observer)  # the last sample, after the traffic
            await sdk.close()
