"""asyncio support of gpubuf.Client (the requests themselves are in C: aio.c).

Client.open_async() and the other *_async methods start their request at once
and return the coroutine made here, which awaits the request's future: so they
work wherever a coroutine is expected (asyncio.TaskGroup.create_task,
asyncio.create_task, asyncio.wait_for). Cancelling the task that awaits it
cancels the future, and that cancels the request."""


async def _await(fut):
    return await fut
