# Child warm-up, the async tier: a job's first event loop (made, run, its leftover task
# cancelled, closed), tasks, gather and a queue, so the first request that awaits does not
# pay asyncio's cold paths and copy-on-write faults.
# Run through the runner as a job in a throwaway __main__; its output is discarded.
import asyncio


async def double(x):
    await asyncio.sleep(0)
    return 2 * x


queue = asyncio.Queue()
queue.put_nowait(await asyncio.gather(*(double(i) for i in range(3))))
left = asyncio.ensure_future(asyncio.sleep(3600))
await queue.get()
