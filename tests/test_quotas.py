"""Fair use between tenants: per-API-key request and image rate limits and concurrent quotas (in
process memory embedded, in Redis distributed), answered with OpenAI-shaped 429s that the official
``openai`` client raises as ``RateLimitError``; OpenAI's ``service_tier`` (or the ``Argusdiff-Tier``
header) picks the argusdiff tier."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fixtures_service import service_settings

from argusdiff.config import Settings
from argusdiff.service.quotas import MemoryQuotaStore, Quotas, RedisQuotaStore, gcra

openai = pytest.importorskip("openai")


def _settings(quotas: dict, **service) -> Settings:
    base = service_settings(**service).model_dump()
    base["quotas"] = quotas
    return Settings.model_validate(base)


def _client(server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0)


def test_gcra_bursts_a_minute_then_goes_at_the_rate():
    tat, allowed = 0.0, 0
    for _ in range(10):
        ok, tat, wait = gcra(tat, 100.0, 1, 6)  # 6 a minute: a burst of 6, then one per 10 s
        allowed += ok
    assert allowed == 6 and wait == pytest.approx(10.0)
    assert gcra(tat, 110.0, 1, 6)[0] and not gcra(tat, 105.0, 1, 6)[0]
    assert not gcra(0.0, 0.0, 7, 6)[0]  # more than a minute's worth at once never fits


@pytest.mark.integration
def test_per_key_rate_limits_with_the_openai_client(live_service):
    quotas = {"default": {"requests_per_minute": 3}, "keys": {"gold": {"images_per_minute": 5}}}
    server = live_service(_settings(quotas, api_keys=["free", "gold"]))
    free, gold = _client(server, "free"), _client(server, "gold")
    for _ in range(3):
        free.images.generate(prompt="a fox", response_format="b64_json")
    with pytest.raises(openai.RateLimitError) as exc:
        free.images.generate(prompt="a fox", response_format="b64_json")
    err = exc.value.body
    assert (err["code"], err["type"], err["param"]) == ("rate_limit_exceeded", "requests", "requests_per_minute")
    assert "3 requests per minute" in err["message"]
    assert 1 <= int(exc.value.response.headers["retry-after"]) <= 20  # the bucket refills one per 20 s
    # another key has its own limits: images, not requests
    gold.images.generate(prompt="a fox", n=4, response_format="b64_json")
    with pytest.raises(openai.RateLimitError) as exc:
        gold.images.generate(prompt="a fox", n=2, response_format="b64_json")
    assert exc.value.body["param"] == "images_per_minute" and exc.value.body["type"] == "images"
    with pytest.raises(openai.BadRequestError) as bad:  # more than a minute's worth never fits: 400
        gold.images.generate(prompt="a fox", n=4, response_format="b64_json", extra_body={"n": 6})
    assert bad.value.body["param"] == "n"
    assert server.service.quotas.refused == {"requests_per_minute": 1, "images_per_minute": 1}


@pytest.mark.integration
def test_concurrent_quota_frees_a_slot_when_its_generation_ends(live_service):
    server = live_service(_settings({"default": {"concurrent": 1}}, workers=1, stand_in_scale=0.5))
    url = f"{server.url}/v1/argusdiff/generations"
    first = httpx.post(url, json={"prompt": "a long one", "wait": False})
    assert first.status_code == 202
    second = httpx.post(url, json={"prompt": "another", "wait": False})
    assert second.status_code == 429 and second.json()["error"]["param"] == "concurrent"
    assert second.json()["error"]["type"] == "concurrent_requests" and int(second.headers["retry-after"]) >= 1
    gid = first.json()["id"]
    from argusdiff.service.worker import wait_until

    assert wait_until(lambda: httpx.get(f"{url}/{gid}").status_code == 200, 60)
    store = server.service.quotas.store
    assert wait_until(lambda: asyncio.run(store.held("anonymous")) == 0, 10)
    third = httpx.post(url, json={"prompt": "now", "wait": False})
    assert third.status_code == 202
    # a cancelled generation frees its slot too
    assert httpx.delete(f"{url}/{third.json()['id']}").status_code == 200
    assert wait_until(lambda: asyncio.run(store.held("anonymous")) == 0, 10)
    assert httpx.post(url, json={"prompt": "again", "wait": False}).status_code == 202


@pytest.mark.integration
def test_service_tier_and_header_pick_the_tier(live_service):
    server = live_service(service_settings())
    client = _client(server, "unused")
    seen = []
    router = server.service.router
    real = router.submit

    async def spy(spec):
        seen.append(spec.tier.value)
        return await real(spec)

    router.submit = spy
    client.images.generate(prompt="a", response_format="b64_json", extra_body={"service_tier": "priority"})
    client.images.generate(prompt="a", response_format="b64_json", extra_body={"service_tier": "flex"})
    client.images.generate(prompt="a", response_format="b64_json", extra_headers={"Argusdiff-Tier": "batch"})
    client.images.generate(prompt="a", response_format="b64_json")
    r = httpx.post(f"{server.url}/v1/argusdiff/generations", json={"prompt": "a"},
                   headers={"Argusdiff-Tier": "priority"}, timeout=30)  # fmt: skip
    assert r.status_code == 200
    assert seen == ["interactive", "batch", "batch", "standard", "interactive"]
    with pytest.raises(openai.BadRequestError) as bad:
        client.images.generate(prompt="a", extra_body={"service_tier": "platinum"})
    assert bad.value.body["param"] == "service_tier"
    bad_header = httpx.post(f"{server.url}/v1/images/generations", json={"prompt": "a"},
                            headers={"Argusdiff-Tier": "gold"})  # fmt: skip
    assert bad_header.status_code == 400 and bad_header.json()["error"]["param"] == "Argusdiff-Tier"


def test_quota_keys_must_be_api_keys():
    with pytest.raises(ValueError, match=r"quotas\.keys"):
        _settings({"keys": {"stranger": {"concurrent": 1}}}, api_keys=["k"])


@pytest.mark.integration
def test_redis_quotas_are_one_budget_for_every_router(redis_any):
    """Two routers' quota checks on one Redis: one budget (Redis's clock), and a concurrent slot
    held by one is counted by the other until it is released."""
    from argusdiff.config import QuotasSection
    from argusdiff.service.transport.redis_client import async_client
    from argusdiff.service.transport.redis_streams import RedisKeys

    cfg = QuotasSection.model_validate({"default": {"requests_per_minute": 4, "concurrent": 2}})

    async def run() -> None:
        clients = [async_client(redis_any.url) for _ in range(2)]
        a, b = (Quotas(cfg, RedisQuotaStore(c, RedisKeys("qx")), retry_after_s=2, lease_s=60) for c in clients)
        leases = [await a.admit(None, 1, "s1"), await b.admit(None, 1, "s2")]
        with pytest.raises(Exception) as full:
            await a.admit(None, 1, "s3")
        assert full.value.param == "concurrent"
        await leases[0].release()
        leases.append(await b.admit(None, 1, "s3"))
        await leases[1].release()
        await leases[2].release()
        await a.admit(None, 1, "s4")  # the 4th request of the minute ...
        with pytest.raises(Exception) as rate:  # ... and the 5th, through the other router
            await b.admit(None, 1, "s5")
        assert rate.value.param == "requests_per_minute" and int(rate.value.headers["Retry-After"]) >= 1
        assert await b.store.held("anonymous") == 1
        for c in clients:
            await c.aclose()

    asyncio.run(run())


def test_memory_store_is_all_or_nothing():
    store = MemoryQuotaStore(clock=lambda: 0.0)

    async def run() -> None:
        assert await store.take("t", {"requests_per_minute": (1, 10), "images_per_minute": (3, 4)}) == (None, 0.0)
        which, _ = await store.take("t", {"requests_per_minute": (1, 10), "images_per_minute": (3, 4)})
        assert which == "images_per_minute"
        assert await store.take("t", {"requests_per_minute": (9, 10)}) == (None, 0.0)  # the refused one took nothing

    asyncio.run(run())
