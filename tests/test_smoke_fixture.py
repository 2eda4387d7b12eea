import redis.asyncio as aioredis


async def test_session_redis_server_answers_on_its_own_port(aredis: aioredis.Redis) -> None:
    assert await aredis.ping()
    info = await aredis.info("server")
    assert int(info["tcp_port"]) != 6379
