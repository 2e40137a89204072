"""Pure units of the preload's bookkeeping."""

from __future__ import annotations

import trio
import trio.testing

from esfuse.preload import _Progress


def test_a_wait_on_a_finished_progress_returns_at_once():
    # The hand-over checked whether the listing had ended, handed a batch over
    # meanwhile, and only then waited: when the listing ended during that batch,
    # it waited for a step that never came, and the preload never finished.
    progress = _Progress()
    woken = []

    async def main() -> None:
        with trio.fail_after(5):
            await run()

    async def run() -> None:
        async with trio.open_nursery() as nursery:

            async def waiter() -> None:
                await progress.wait()
                woken.append("step")
                await progress.wait()
                woken.append("finished")
                await progress.wait()
                woken.append("again")

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            progress.step()
            await trio.testing.wait_all_tasks_blocked()
            progress.finish()

    trio.run(main)
    assert woken == ["step", "finished", "again"]
